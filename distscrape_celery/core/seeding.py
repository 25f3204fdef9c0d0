"""Creating a job (or adding seeds to it) from its spec as data: one code path for
``distscrape seed`` and the job API, with the same checks and the same errors."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..errors import ConfigError, SpecError
from ..job.schedule import Schedule
from ..job.spec import JobSpec, build_spec
from ..tracker import Tracker
from .manager import CrawlManager, SeedResult
from .schedules import set_schedule


@dataclass(frozen=True)
class Seeded:
    """What :func:`seed_job` did: the seeding's figures, and the schedule it set (with its next
    run) if the spec has one."""

    seeded: SeedResult
    schedule: Optional[Schedule] = None
    next_due: Optional[float] = None


def spec_from_data(data: dict[str, Any], names: Optional[dict[str, str]] = None) -> JobSpec:
    """The checked spec of ``data`` (a job file's fields), its output made absolute; errors
    (:class:`SpecError`) name fields as ``names`` does (default: as in the data)."""
    # The sections' names are added to the caller's, which name the same fields in later checks.
    names = names if names is not None else {}
    if not data.get("seeds"):
        field = names.get("seeds", "seeds")
        raise SpecError(f"invalid job spec: {field}: give at least one seed",
                        [(field, "give at least one seed")])
    saver = data.setdefault("saver", {})
    if isinstance(saver, dict):
        output = str(saver.get("output") or "crawl-output")
        # Absolute, so that every worker writes to the same place whatever its directory. A URL
        # (the redis saver's output) is not a path.
        saver["output"] = output if "://" in output else str(Path(output).expanduser().resolve())
    # A problem with the saver or scraper as a whole is named by what chose its kind.
    for section, chooser in (("scraper", "kind"), ("saver", "kind"), ("sitemaps", "mode")):
        if f"{section}.{chooser}" in names:
            names[section] = names[f"{section}.{chooser}"]
    return build_spec(data, names)


def check_local_output(spec: JobSpec) -> None:
    """Make sure the output directory of a files saver (or the directory of an archive saver's
    file) can be written on this machine, creating it if need be, before anything is fetched.
    Other savers (a Redis URL, a custom class) are not checked here."""
    kind, output = spec.saver.kind, spec.saver.output
    if kind == "files":
        directory = Path(output)
    elif kind in ("tar", "warc", "jsonl"):
        directory = Path(output).parent
    else:
        return
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"cannot write the output to {directory}: it is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        descriptor, probe = tempfile.mkstemp(prefix=".~distscrape-probe-", dir=directory)
        os.close(descriptor)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(
            f"cannot write the output to {directory}: {exc.strerror or exc}"
        ) from None


def seed_job(
    tracker: Tracker, manager: CrawlManager, job: str, spec: JobSpec, *,
    more: Iterable[str] = (), priority: int = 0,
    on_progress: Optional[Callable[[int, int], None]] = None,
) -> Seeded:
    """Create ``job`` with ``spec`` (or add its seeds, and ``more``, to it: see
    :meth:`CrawlManager.seed`) and give it the spec's schedule, if any. When every live worker
    runs on this machine, the output is checked first: a bad one is refused before anything is
    fetched (workers elsewhere write on their own hosts, which cannot be checked here)."""
    live = [worker for worker in tracker.workers() if worker.alive]
    if live and all(worker.host == socket.gethostname() for worker in live):
        check_local_output(spec)
    seeded = manager.seed(job, spec, more, on_progress=on_progress, priority=priority)
    if spec.schedule is None:
        return Seeded(seeded)
    schedule = spec.schedule.schedule()
    return Seeded(seeded, schedule, set_schedule(tracker, job, schedule))
