"""How long a scrape task carries on with the items its pages hand out: a while (the workers'
``carry_seconds``, well within a task's time limit; 0: never), and never once its worker was
told to stop (Celery's warm or cold shutdown flags)."""

from __future__ import annotations

import time

import pytest
from celery.worker import state as worker_state

from distscrape_celery.errors import ConfigError
from distscrape_celery.settings import Settings
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


def test_the_window_is_a_setting_within_the_task_time_limit():
    assert Settings().carry_seconds == 1.0
    assert Settings.from_env({"DISTSCRAPE_CARRY_SECONDS": "0"}).carry_seconds == 0
    assert _carry_for(0) is None
    with pytest.raises(ConfigError, match="DISTSCRAPE_CARRY_SECONDS.*quarter of task_time_limit"):
        Settings.from_env({"DISTSCRAPE_CARRY_SECONDS": "3", "DISTSCRAPE_TASK_TIME_LIMIT": "10"})
    with pytest.raises(ConfigError, match="DISTSCRAPE_CARRY_SECONDS"):
        Settings.from_env({"DISTSCRAPE_CARRY_SECONDS": "-1"})
