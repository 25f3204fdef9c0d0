"""How long a scrape task carries on with the items its unchanged pages hand out: a while, and
never once its worker was told to stop (Celery's warm or cold shutdown flags)."""

from __future__ import annotations

import time

from celery.worker import state as worker_state

from distscrape_celery.worker.tasks import _carry_for


def test_a_task_carries_on_for_its_window_only():
    go_on = _carry_for(0.2)
    assert go_on()
    time.sleep(0.25)
    assert not go_on()


def test_a_stopping_worker_carries_on_no_more(monkeypatch):
    go_on = _carry_for(60)
    assert go_on()
    monkeypatch.setattr(worker_state, "should_stop", 0)  # the exit code of a warm shutdown
    assert not go_on()
    monkeypatch.setattr(worker_state, "should_stop", None)
    monkeypatch.setattr(worker_state, "should_terminate", True)
    assert not go_on()
