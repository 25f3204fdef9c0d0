"""The README's many-host setup on this host, as the benchmark runs it: workers started as
``BENCH_LAUNCH`` says (``celery multi start`` by default), a throwaway Redis, ``distscrape seed``,
and the crawl watched until the tracker says the job is finished; and the scale-out on simulated
hosts, each worker in a CPU cgroup of its own (``bench.cgroups``)."""

from __future__ import annotations

import atexit
import os
import shlex
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import Optional

from bench.cgroups import HostCgroups
from bench.crawl_command import high_limits
from bench.helpers import (BIN, PEERS, children_of, clean_env, context_switches, cpu_ticks, own_cpu,
                           own_system_cpu, proc_status)
from bench.probes import (RUNS, Occupancy, Result, StartupCpu, ThrowawayRedis, cap_used,
                          site_figures)
from bench.sites import Site

README_WORKER_ARGS = ["-P", "threads", "-c", "32", "--without-gossip", "--without-mingle"]  # two a core
QUEUES = ["-Q", "distscrape.scrape,distscrape.save"]
# BENCH_LAUNCH: how the workers are started. `multi` (the default, the README's command):
# `celery multi start`, which detaches each worker into a session of its own; `sessions`:
# each started here in a session of its own, as systemd starts its units; `loop`: as
# background jobs of one shell, all in one session. Linux shares CPU between sessions
# (autogroups) before it shares it between processes: workers in one session get no more
# of it than the Redis server beside them.
# `forks`: one `python -m distscrape_celery.worker.main --forks` process (as `distscrape
# crawl` starts its workers, but with gossip and mingle on), which imports once and forks one
# worker per group entry (each group's options must be `-P threads -c N`).
# `mains`: as `sessions`, but each `python -m distscrape_celery.worker.main` (the same
# worker without Celery's command line and the plugins it imports).
LAUNCHES = ("multi", "sessions", "loop", "forks", "mains")
HOST_COUNTS = (1, 2, 4)


def crawl_workers(site: Site, site_name: str, work: Path, args, workers: int,
                  max_pages: Optional[int] = None, worker_args: Optional[list[str]] = None,
                  worker_env: Optional[dict[str, str]] = None,
                  worker_groups: Optional[list[tuple[int, list[str]]]] = None,
                  polite: bool = False, group_prefix: Optional[list[list[str]]] = None) -> Result:
    """The README's many-host setup on this host: ``celery multi start`` of ``workers`` workers
    with ``-P threads -c 32`` (or ``worker_args``; or ``worker_groups``, counts of workers with
    options of their own), with ``worker_env`` (BENCH_LAUNCH, BENCH_PIN, BENCH_PROFILE: see
    WorkerCrawl), then ``distscrape seed`` (limits set high; with ``polite``, the default ones);
    waits until the tracker says the job is finished. ``group_prefix``: a command prefix for
    each group, which its ``celery multi start`` (or each of its workers' commands) runs under."""
    worker_args = README_WORKER_ARGS if worker_args is None else worker_args
    groups = worker_groups or [(workers, worker_args)]
    crawl = WorkerCrawl(site, site_name, work, args, groups, dict(worker_env or {}),
                        group_prefix, max_pages)
    return crawl.run(max_pages, polite)


class WorkerCrawl:
    """One crawl by workers: its Redis, its workers and how they were started, and what it
    measured. ``worker_env`` may hold, besides the workers' environment: BENCH_PIN=1 (each
    worker process on one CPU, by taskset, round robin, to see what the scheduler moving threads
    between CPUs costs; with BENCH_LAUNCH=sessions), BENCH_LAUNCH (one of LAUNCHES) and
    BENCH_PROFILE=DIR (py-spy records each worker, collapsed stacks of samples holding the GIL,
    from the seed to the end, into DIR/LABEL-PID.txt)."""

    def __init__(self, site: Site, site_name: str, work: Path, args,
                 groups: list[tuple[int, list[str]]], worker_env: dict[str, str],
                 group_prefix: Optional[list[list[str]]], max_pages: Optional[int]) -> None:
        from distscrape_celery.settings import Settings
        from distscrape_celery.tracker import RedisTracker

        self.site, self.site_name, self.work, self.args = site, site_name, work, args
        self.groups = groups
        self.workers = sum(count for count, _ in groups)
        self.prefix = group_prefix or [[] for _ in groups]
        run = next(RUNS)  # each crawl its own Redis directory, job and output
        self.server = ThrowawayRedis(work, f"redis-{site_name}-{self.workers}w-{max_pages}-{run}")
        self.pin = worker_env.pop("BENCH_PIN", "") not in ("", "0")
        self.launch = worker_env.pop("BENCH_LAUNCH", "sessions" if self.pin else "multi")
        self.profile_dir = worker_env.pop("BENCH_PROFILE", "")
        if self.launch not in LAUNCHES or (self.pin and self.launch != "sessions"):
            raise SystemExit(f"BENCH_LAUNCH={self.launch!r}: multi, sessions, loop, forks or "
                             "mains (BENCH_PIN: sessions)")
        if group_prefix and self.launch in ("loop", "forks"):
            raise SystemExit(f"BENCH_LAUNCH={self.launch}: its workers cannot each have a prefix")
        self.worker_env = worker_env
        self.job = f"bench-{site_name}-{self.workers}-{run}"
        self.output = work / f"{self.job}-out"
        # Workers write a path output only under roots their operator set: this one's.
        self.env = dict(clean_env(), DISTSCRAPE_REDIS_URL=self.server.url,
                        DISTSCRAPE_OUTPUT_ROOTS=str(self.output), **worker_env)
        self.settings = Settings(redis_url=self.server.url)
        self.tracker = RedisTracker.from_settings(self.settings)
        self.procs: list[subprocess.Popen] = []
        self.shell: Optional[subprocess.Popen] = None
        self.multi_files = [f"--pidfile={work}/{self.job}-%n.pid",
                            f"--logfile={work}/{self.job}-%n.log"]
        self.multi_groups = [([f"g{g}w{i}" for i in range(count)], opts)
                             for g, (count, opts) in enumerate(groups)]
        self.multi_names = [name for names, _ in self.multi_groups for name in names]

    # ------------------------------------------------------------------------ the workers

    def commands(self) -> list[list[str]]:
        """Each worker's own command (the launches but `multi` and `forks` run these)."""
        cores = os.cpu_count() or 1
        program = ([str(BIN / "python"), "-m", "distscrape_celery.worker.main"]
                   if self.launch == "mains" else [str(BIN / "celery"), "-A", "distscrape_celery",
                                                    "worker"])
        each = [(before, opts) for before, (count, opts) in zip(self.prefix, self.groups)
                for _ in range(count)]
        return [[*before, *(["taskset", "-c", str(i % cores)] if self.pin else []), *program,
                 *QUEUES, *opts, "-n", f"distscrape-{i}@%h", "--loglevel", "WARNING"]
                for i, (before, opts) in enumerate(each)]

    def launch_workers(self) -> None:
        """Start the workers as BENCH_LAUNCH says, each from the work directory: `python -m`
        puts its directory first on sys.path, and from a checkout that would import the
        checkout's package, not the one worker_env's PYTHONPATH names (a baseline's)."""
        work, job = self.work, self.job
        if self.launch == "multi":
            for before, (names, opts) in zip(self.prefix, self.multi_groups):
                subprocess.run([*before, str(BIN / "celery"), "multi", "start", *names, "-A",
                                "distscrape_celery", *QUEUES, *opts, "--loglevel=WARNING",
                                *self.multi_files], env=self.env, check=True,
                               capture_output=True, cwd=work)
        elif self.launch == "loop":
            script = " ".join(f"{shlex.join(c)} >{shlex.quote(str(work / f'{job}-worker{i}.log'))}"
                              f" 2>&1 &" for i, c in enumerate(self.commands())) + " wait"
            self.shell = subprocess.Popen(["bash", "-c", script], env=self.env,
                                          start_new_session=True, cwd=work)
        elif self.launch == "forks":
            self._start(self.forks_command(), work / f"{job}-forks.log")
        else:
            for i, command in enumerate(self.commands()):
                self._start(command, work / f"{job}-worker{i}.log")

    def forks_command(self) -> list[str]:
        """One worker.main process forking a worker per group entry. worker.main's switches
        (--without-gossip, --without-mingle) pass on: the first group's, which every worker
        then gets."""
        threads = [opts[opts.index("-c") + 1] for count, opts in self.groups
                   for _ in range(count)]
        flags = [o for o in self.groups[0][1] if o.startswith("--without-")]
        return [str(BIN / "python"), "-m", "distscrape_celery.worker.main", *QUEUES,
                "-P", "threads", "--forks", ",".join(threads), "-n", "distscrape@%h",
                "--loglevel", "WARNING", *flags]

    def _start(self, command: list[str], log_path: Path) -> None:
        with log_path.open("ab") as log:
            self.procs.append(subprocess.Popen(command, env=self.env, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True,
                                               cwd=self.work))

    def abandon(self) -> None:
        """The run failed before it stopped its workers: kill them and the Redis all the same
        (a failed run once left four idle workers polling for an hour and a half, beside every
        later measurement)."""
        if self.launch == "multi":
            subprocess.run([str(BIN / "celery"), "multi", "kill", *self.multi_names,
                            *self.multi_files], env=self.env, capture_output=True, timeout=60)
        for proc in [*self.procs, *([self.shell] if self.shell is not None else [])]:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.server.stop()

    def wait_up(self) -> None:
        deadline = time.monotonic() + 60
        while sum(1 for w in self.tracker.workers() if w.alive) < self.workers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.workers} workers did not come up; see {self.work}")
            time.sleep(0.1)

    def worker_pids(self) -> list[int]:
        if self.launch == "multi":
            files = [Path(self.work, f"{self.job}-{name}.pid") for name in self.multi_names]
            deadline = time.monotonic() + 10  # a pidfile may come after the worker's heartbeat
            while not all(f.exists() for f in files) and time.monotonic() < deadline:
                time.sleep(0.05)
            return [int(f.read_text()) for f in files]
        if self.launch == "forks":
            return children_of(self.procs[0].pid)
        if self.launch == "loop":
            return children_of(self.shell.pid)
        return [proc.pid for proc in self.procs]

    def root_pids(self) -> list[int]:
        """The processes whose CPU, with their descendants', is the workers' CPU."""
        if self.launch == "multi":
            return self.worker_pids()
        return [proc.pid for proc in [*self.procs, *([self.shell] if self.shell else [])]]

    def worker_cpu(self) -> float:  # from /proc: the workers' own CPU so far
        return sum(own_cpu(pid) for pid in self.worker_pids())

    def worker_system_cpu(self) -> float:  # the kernel's part of it
        return sum(own_system_cpu(pid) for pid in self.worker_pids())

    def start_spies(self) -> list[subprocess.Popen]:
        """BENCH_PROFILE: a py-spy recording of each worker, from now to stop_spies."""
        if not self.profile_dir:
            return []
        Path(self.profile_dir).mkdir(parents=True, exist_ok=True)
        spies = [subprocess.Popen(
            [str(PEERS / "bin" / "py-spy"), "record", "--pid", str(pid), "--nonblocking", "--gil",
             "--format", "raw", "--rate", "100", "-o",
             str(Path(self.profile_dir, f"{self.site_name}-{self.launch}-{pid}.txt"))],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for pid in self.worker_pids()]
        time.sleep(0.5)
        return spies

    def stop_workers(self) -> float:
        """Stop the workers warmly; their CPU seconds, start-up included."""
        cpu = 0.0
        if self.launch == "multi":
            # Detached, not our children: their CPU up to now, from /proc, then a warm stop.
            cpu = self.worker_cpu()
            subprocess.run([str(BIN / "celery"), "multi", "stopwait", *self.multi_names,
                            *self.multi_files], env=self.env, capture_output=True, timeout=60)
            return cpu
        if self.launch == "loop":
            # The shell's wait reaps the workers: their CPU is in the shell's own rusage.
            pids, procs = children_of(self.shell.pid), [self.shell]
        else:
            pids, procs = [proc.pid for proc in self.procs], self.procs
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        for proc in procs:
            try:
                _, _, usage = os.wait4(proc.pid, 0)
                cpu += usage.ru_utime + usage.ru_stime
            except ChildProcessError:
                pass
        return cpu

    # ------------------------------------------------------------------------- the crawl

    def run(self, max_pages: Optional[int], polite: bool) -> Result:
        """Start the workers, seed the job once they are up, watch it to its end (or
        ``--timeout``), stop them; the crawl's Result."""
        self.started = time.monotonic()
        self.launch_workers()
        atexit.register(self.abandon)
        self.wait_up()
        mark = self.site.mark()
        # The workers idle until the seed: sampled from here, their CPU at the first request
        # is all they spent before it.
        startup, roots = StartupCpu(self.site, mark), self.root_pids()
        startup.watch(lambda: roots)
        self.server.probe.start = {}
        self.server.probe.sample()
        spies = self.start_spies()
        switches_before = context_switches(self.worker_pids())
        cpu_before, system_before = self.worker_cpu(), self.worker_system_cpu()
        each_before, seeded = {pid: own_cpu(pid) for pid in self.worker_pids()}, time.monotonic()
        ticks = [(time.time(), cpu_ticks())]  # sampled as the crawl goes, for its idle time
        self.seed(max_pages, polite)
        ok, occupancy = self.watch(ticks)
        self.server.probe.sample()
        crawl_cpu = self.worker_cpu() - cpu_before
        crawl_system = self.worker_system_cpu() - system_before
        seed_wall = time.monotonic() - seeded
        busiest = max((own_cpu(pid) - cpu for pid, cpu in each_before.items()),
                      default=0.0) / max(seed_wall, 1e-9)
        for spy in spies:
            spy.send_signal(signal.SIGINT)
        for spy in spies:
            spy.wait(30)
        switches = [b - a for a, b in zip(switches_before, context_switches(self.worker_pids()))]
        memory = [proc_status(pid) for pid in self.worker_pids()]
        cpu = self.stop_workers()
        atexit.unregister(self.abandon)
        wall = time.monotonic() - self.started
        stats = self.tracker.stats(self.job)
        self.server.stop()
        result = self.result(wall, cpu, busiest, crawl_cpu, seed_wall, ok and stats.dead == 0)
        result.startup_cpu = startup.seconds()
        site_figures(result, self.site, mark)
        result.note = (f"done {stats.done}, dead {stats.dead}"
                       + (f"; {occupancy}" if occupancy else ""))
        if result.pages:
            result.note += (f"; workers' CPU from seed to finish "
                            f"{1000 * crawl_cpu / result.pages:.2f} ms a page"
                            f" ({1000 * crawl_system / result.pages:.2f} in the kernel), the "
                            f"busiest process {busiest:.2f} of a core")
        result.note += self.machine_note(memory, switches, ticks, mark, result.pages)
        result.ok = result.ok and result.pages == result.distinct
        return result

    def seed(self, max_pages: Optional[int], polite: bool) -> None:
        limit = ["--max-pages", str(max_pages)] if max_pages else []
        seed = subprocess.run(
            [str(BIN / "distscrape"), "seed", self.job, *self.site.seeds, "--output",
             str(self.output), *([] if polite else high_limits(self.args)), *limit],
            env=self.env, capture_output=True, text=True)
        if seed.returncode != 0:
            raise RuntimeError(f"seed failed: {seed.stderr}")

    def watch(self, ticks: list) -> tuple[bool, Optional[Occupancy]]:
        """Poll the tracker (and the machine's CPU ticks) until the job is finished or the
        crawl's ``--timeout`` since its start has passed: whether it finished, and the items'
        occupancy with ``--sample``."""
        occupancy = (Occupancy(self.server.probe.client,
                               (self.settings.scrape_queue, self.settings.save_queue))
                     if self.args.sample else None)
        while time.monotonic() - self.started < self.args.timeout:
            self.server.probe.sample()
            ticks.append((time.time(), cpu_ticks()))
            stats = self.tracker.stats(self.job)
            if stats.finished:
                return True, occupancy
            if occupancy is not None:
                occupancy.add(stats)
            time.sleep(0.03 if occupancy is not None else 0.25)
        return False, occupancy

    def result(self, wall: float, cpu: float, busiest: float, crawl_cpu: float,
               seed_wall: float, ok: bool) -> Result:
        """The crawl's Result, named after its workers and how they were started."""
        launch, groups, worker_env = self.launch, self.groups, self.worker_env
        label = " + ".join(f"{count} x celery {' '.join(opts)}" for count, opts in groups)
        label = " ".join([label, *(f"{k}={v}" for k, v in worker_env.items()),
                          *(["pinned"] * self.pin), *([f"({launch})"] * (launch != "multi"))])
        readme = (groups == [(self.workers, README_WORKER_ARGS)] and not worker_env
                  and launch == "multi")
        cmds, rcpu, reads = self.server.probe.delta()
        result = Result(f"{'README workers' if readme else 'workers'}: "
                        f"{'celery multi start: ' if launch == 'multi' else ''}{label}",
                        self.site_name, wall=wall, cpu=cpu, redis_cmds=cmds, redis_cpu=rcpu,
                        redis_reads=reads, busiest=busiest, seed_cpu=crawl_cpu,
                        seed_wall=seed_wall, ok=ok, redis_probe=self.server.probe)
        result.redis_scripts = self.server.probe.scripts()
        return result

    def machine_note(self, memory: list, switches: list[int], ticks: list, mark: tuple,
                     pages: int) -> str:
        """The workers' memory and threads, the machine's idle time and the context switches
        a page, as a note's continuation."""
        note = ""
        if memory and all(memory):
            # Each worker's peak resident memory and its threads at the end (the pool's threads
            # start as tasks come; Celery's own besides).
            note += (f"; workers' peak RSS {statistics.mean(m[0] for m in memory) / 1024:.1f} "
                     f"MiB each (mean), {statistics.mean(m[1] for m in memory):.0f} threads")
            # Between the samples inside the site's first and last page: not the seed's start-up
            # or the wait for the last saves, which idle the machine whatever the workers do.
            hits = [t for t, path in self.site.requests_since(mark[0]) if path != "/robots.txt"]
            inside = [x for t, x in ticks if hits and hits[0] <= t <= hits[-1]]
            if len(inside) > 1:
                idle, steal, busy = (b - a for a, b in zip(inside[0], inside[-1]))
                total = idle + steal + busy
                note += f"; machine idle {idle / total:.0%}, steal {steal / total:.0%}"
        if switches and pages:
            note += (f"; context switches a page: {switches[0] / pages:.1f} voluntary, "
                     f"{switches[1] / pages:.1f} involuntary")
        return note


def crawl_hosts(site: Site, site_name: str, work: Path, args) -> list[Result]:
    """``--only scale-hosts``: 1, 2 and 4 simulated hosts (4, 2, 1 every other round) crawl
    ``--scale-pages`` pages of ``site``, sharing one Redis. Each host is one worker of
    ``--scale-args`` started by its own ``celery multi start`` inside a CPU cgroup capped at
    ``--host-cpu`` of a core (``bench.cgroups.HostCgroups``); the bench, Redis and the site stay
    outside. Each row's note adds the machine's load average before and after the crawl and how
    often the hosts' quota ran out."""
    counts = HOST_COUNTS if args.round % 2 == 0 else HOST_COUNTS[::-1]
    opts = args.scale_args.split()
    found = []
    for hosts in counts:
        load = os.getloadavg()[0]
        with HostCgroups(args.host_cpu) as cgroups:
            run = next(RUNS)
            groups = [cgroups.make(f"{run}-{i}") for i in range(hosts)]
            result = crawl_workers(site, site_name, work, args, hosts,
                                   max_pages=args.scale_pages, worker_groups=[(1, opts)] * hosts,
                                   group_prefix=[cgroups.enter_command(g) for g in groups])
            periods = [cgroups.throttling(g) for g in groups]
        result.kind = f"hosts-{hosts}"
        result.name = (f"{hosts} simulated host{'s' * (hosts > 1)} at {args.host_cpu:g} of a "
                       f"core, each celery multi start: 1 x celery {' '.join(opts)}")
        ran, throttled = sum(p for p, _ in periods), sum(t for _, t in periods)
        result.note += (f"; load average {load:.2f} -> {os.getloadavg()[0]:.2f}; quota used up "
                        f"in {throttled / max(ran, 1):.0%} of the hosts' {ran} periods; the "
                        f"hosts used {cap_used(result, hosts, args.host_cpu):.0%} of their cap")
        found.append(result)
    return found
