"""A job on a bare tracker, for the tests that call the tracker directly: the smallest spec, a
job with one registered worker, a clock the in-memory tracker runs on, and Redis's count of the
item scripts it ran."""

from __future__ import annotations

from typing import Any, Optional

from distscrape_celery.tracker import CrawlLimits

# The smallest valid spec: the tests that use it hand the tracker their items themselves.
SPEC = '{"seeds": ["http://127.0.0.1/"]}'

# The commands that run an item script: FCALL from the function library, EVALSHA otherwise.
ITEM_SCRIPT_COMMANDS = ("fcall", "evalsha")
# Those and EVAL: every command that runs a script of any kind.
SCRIPT_COMMANDS = (*ITEM_SCRIPT_COMMANDS, "eval")


def new_job(tracker: Any, job: str = "j", concurrency: int = 2, *, spec: str = SPEC,
            limits: Optional[CrawlLimits] = None) -> str:
    """Create ``job`` (``spec``, ``limits``) on ``tracker`` and register one worker of
    ``concurrency`` slots on host "host", pid 1; returns that worker's id."""
    tracker.create_job(job, spec, limits)
    return tracker.register_worker("host", 1, concurrency)


class FakeClock:
    """A clock for the in-memory tracker: starts far from 0 and moves only when a test sets
    ``now``, so that lease and delay times are exact."""

    def __init__(self, start: float = 1_000_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def script_calls_by_command(client: Any,
                            commands: tuple[str, ...] = ITEM_SCRIPT_COMMANDS) -> dict[str, int]:
    """How many times Redis has run each of ``commands`` since its stats were last reset."""
    stats = client.info("commandstats")
    return {command: stats.get(f"cmdstat_{command}", {}).get("calls", 0) for command in commands}


def script_calls(client: Any, commands: tuple[str, ...] = ITEM_SCRIPT_COMMANDS) -> int:
    """How many times Redis has run any of ``commands`` (by default: the item scripts)."""
    return sum(script_calls_by_command(client, commands).values())
