"""Loaded with ``-I tests.plugins.slow_start``: the worker pauses in its start, after it has
registered and before Celery has installed its signal handlers, and logs that it does."""

from __future__ import annotations

import logging
import time

from celery.signals import celeryd_after_setup

log = logging.getLogger(__name__)


@celeryd_after_setup.connect
def _pause(**_):
    log.warning("slow start: pausing before Celery's signal handlers")
    time.sleep(60)
