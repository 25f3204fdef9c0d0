"""Loaded with ``-I plugins.loaded_modules``: when the worker is ready it logs which modules of
Celery's command line (and the plugins that loads) the process holds."""

from __future__ import annotations

import logging
import sys

from celery.signals import worker_ready

log = logging.getLogger(__name__)

CLI_MODULES = ("celery.bin", "flower", "click_repl", "prompt_toolkit")


@worker_ready.connect
def _report(**_):
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in CLI_MODULES or m.startswith("celery.bin"))
    log.warning("command-line modules loaded: %d %s", len(loaded), loaded[:5])
