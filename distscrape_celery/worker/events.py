"""Signals a worker sends about jobs, for users to hook (``celery ... worker -I yourmodule``).

``job_finished`` is sent once per finished job across the whole cluster, in the worker whose
maintenance detected it, with ``job`` (its name) and ``info`` (a
:class:`~distscrape_celery.tracker.JobInfo`: state, times, final figures).
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

job_finished = Signal(name="distscrape.job_finished")
