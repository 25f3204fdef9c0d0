"""A job_finished receiver, loaded with ``celery worker -I tests.plugins.hooks``: it logs one line
per event, which the tests count in the workers' logs."""

from __future__ import annotations

import logging

from distscrape_celery.worker.events import job_finished

log = logging.getLogger(__name__)


@job_finished.connect
def _log_it(sender, job, info, **_):
    log.warning("job_finished hook: %s %s done=%s", job, info.state.value, info.final.get("done"))
