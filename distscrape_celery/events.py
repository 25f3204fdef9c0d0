"""Where hook modules written before the signal moved import it from: ``from
distscrape_celery.events import job_finished`` was the documented way to hook a finished job
(docs/guide.md), in users' own modules loaded by their workers with ``-I``. The signal itself is
:data:`distscrape_celery.worker.events.job_finished`; this name is the same object."""

from __future__ import annotations

from .worker.events import job_finished

__all__ = ["job_finished"]
