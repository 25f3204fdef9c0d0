"""Loaded with ``-I tests.plugins.loaded_modules``: when the worker is ready it logs which
modules of Celery's command line (and the plugins that loads) the process holds, and, in a worker
forked by ``worker.main --forks``, which modules it imported itself after the fork."""

from __future__ import annotations

import logging
import sys

from celery.signals import worker_ready

log = logging.getLogger(__name__)

CLI_PACKAGES = ("celery.bin", "flower", "click_repl", "prompt_toolkit")


@worker_ready.connect
def _report(**_):
    loaded = sorted(m for m in sys.modules
                    if any(m == p or m.startswith(p + ".") for p in CLI_PACKAGES))
    log.warning("command-line modules loaded: %d %s", len(loaded), loaded[:5])


@worker_ready.connect
def _report_after_fork(**_):
    from distscrape_celery.worker import main

    if main.preloaded_modules:
        late = sorted(set(sys.modules) - main.preloaded_modules)
        log.warning("modules imported after the fork: %d %s", len(late), late)
