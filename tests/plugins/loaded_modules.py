"""Loaded with ``-I plugins.loaded_modules``: when the worker is ready it logs which modules of
Celery's command line (and the plugins that loads) the process holds."""

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
