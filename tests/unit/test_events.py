"""The job_finished signal, under its place in worker/ and the path hook modules used before."""

from __future__ import annotations


def test_the_earlier_import_path_names_the_same_signal():
    from distscrape_celery.events import job_finished as earlier
    from distscrape_celery.worker.events import job_finished

    assert earlier is job_finished
