"""The tracker contract as a stateful property: random interleavings of every item operation,
worker deaths, expiries and stale tokens, on InMemoryTracker and on RedisTracker against the real
Redis from conftest, each step checked against a small Python model of the item life cycle
(tracker/base.py) that follows the rules of tracker/redis/lua/_lib.lua (retry_or_dead) and the item scripts.

Politeness is in the model too: items belong to domains with in-flight caps (dispatch never takes
a domain past its cap, and takes every item it may up to the broker's room), one domain whose fetch
slot was taken for an hour (every checkout of its items is throttled and hands the item back),
retries with a delay that wait in the delayed set until their backoff ends, max_pages and
max_pages_per_domain, and retry_dead. So are priorities: items are added at random priorities
(seeds by add, found links by scraped), keep them through every requeue, and within a domain
dispatch takes the highest priority first, equal ones first come, first served (items put back
at the head of their queue go first; those put back together by one call may come in any order
among themselves). So are job states: pause, resume and cancel (a paused or
cancelled job dispatches nothing, and a delivered message hands its item back), and completion,
detected by exactly one maintenance; new items or retried dead ones make a finished job run again.

Nothing sleeps. Leases are long (an hour), so nothing expires unless a rule forces it: the
in-memory tracker's scripts run on a fake clock that ticks a second per step, and an expiry
rewrites the item's deadline to a moment long past in the job's zset, on the real Redis or on the
in-memory tracker's own (:func:`force_expire`); a dying worker's heartbeat is moved into the past
the same way.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Optional

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from distscrape_celery.tracker import keys
from distscrape_celery.errors import JobStateError
from distscrape_celery.tracker import (
    CrawlLimits,
    DomainLimits,
    FailOutcome,
    Fault,
    InMemoryTracker,
    JobAction,
    JobState,
    LeaseStatus,
    RedisTracker,
    SaveStart,
    Tracker,
)
from distscrape_celery.tracker.redis.items import MAX_REASON
from distscrape_celery.tracker.redis.shards import MAX_DISPATCH_BATCH
from tests.support.tracker_state import live_items_call, parse_live_items
from tests.support.jobs import SPEC, FakeClock

JOB = "props"
LEASE = 3600.0  # nothing expires by itself during an example
# Every item an example may add (duplicates are frequent), on three domains: IDs (the job's
# pseudo-domain), a.invalid and b.invalid; SLOW's items are added by the set-up only.
UNIVERSE = (
    [f"u{n}" for n in range(4)] + [f"http://a.invalid/{n}" for n in range(4)]
    + [f"http://B.invalid/{n}" for n in range(4)]
)
SLOW = "slow.invalid"  # its fetch slot is taken for an hour at the start
SLOW_ITEMS = [f"http://{SLOW}/1", f"http://{SLOW}/2"]
DOMAINS = sorted({keys.domain_of(i) for i in UNIVERSE + SLOW_ITEMS})
GHOST = "ghost"  # never added: operations on it meet an unknown item
PAST = 1000.0  # forced deadlines and heartbeats are PAST + n: long gone on either clock
EXPIRED_BELOW = PAST + 1_000_000  # a deadline below this was forced; every real one is above
BOGUS_TOKEN = 10**9  # never handed out
REASONS = ["boom", "HTTP 500", "x" * (MAX_REASON + 50)]  # the last one is cut to MAX_REASON
IN_FLIGHT = {"d": "dispatched", "l": "leased", "S": "leased", "s": "pending"}  # state -> set
TIMED = {**IN_FLIGHT, "w": "delayed"}  # every state with a deadline or due time
HELD = "lsS"  # states with a holder (worker, token)
PRIORITIES = st.sampled_from([0, 0, 0, 1, 1, 2, -1, 1000, -1000])
DEPTH_SPAN = 2**24  # an item's rank in its live value: priority * DEPTH_SPAN + depth
MAX_WORKERS = 12  # registered in one example, dead ones included


# -- reaching into the tracker's Redis, real or in-memory (test helpers, not the code under test) --


def force_expire(tracker: Tracker, job: str, item: str, when: float) -> None:
    """Make ``item``'s deadline in whichever in-flight set holds it ``when`` (a past moment)."""
    k = keys.JobKeys(job)
    pipe = tracker.client.pipeline(transaction=True)
    for zset in (k.dispatched, k.leased, k.pending, k.delayed):
        pipe.zadd(zset, {item: when}, xx=True)  # XX: only where it is
    pipe.execute()


def stop_heartbeats(tracker: Tracker, worker: str) -> None:
    """Pretend ``worker`` last beat long ago: it no longer counts as alive."""
    tracker.client.zadd(keys.HEARTBEATS, {worker: PAST})


@dataclass
class Snapshot:
    """A tracker's whole state for one job, the same shape for either kind."""

    states: dict[str, str]  # item -> state letter
    depths: dict[str, int]
    priorities: dict[str, int]
    queues: dict[str, list[str]]  # domain -> its list and priority zset (empty ones left out)
    listed: set[str]  # domains listed for dispatch
    inflight: dict[str, int]
    dispatched: dict[str, float]  # item -> deadline
    leased: dict[str, float]
    pending: dict[str, float]
    delayed: dict[str, float]
    owners: dict[str, tuple[str, int]]
    fails: dict[str, int]
    lost: dict[str, int]
    dead: dict[str, str]
    queued: int  # the counter of queued items
    seen: int  # members of the seen set: every item ever added (done ones are only there)


def snapshot(tracker: Tracker, job: str) -> Snapshot:
    k = keys.JobKeys(job)
    pipe = tracker.client.pipeline(transaction=True)
    live_items_call(pipe, job)
    for domain in DOMAINS:
        pipe.lrange(k.domain_queue(domain), 0, -1)
        pipe.zrange(k.priority_queue(domain), 0, -1)
    pipe.zrange(k.domains, 0, -1)
    pipe.hgetall(k.inflight)
    for zset in (k.dispatched, k.leased, k.pending, k.delayed):
        pipe.zrange(zset, 0, -1, withscores=True)
    for h in (k.owners, k.fails, k.lost, k.dead):
        pipe.hgetall(h)
    pipe.hget(k.stats, "queued")
    items, *rest = pipe.execute()
    items = parse_live_items(items)
    queues = {d: rest[2 * n] + rest[2 * n + 1] for n, d in enumerate(DOMAINS)}
    rest = rest[2 * len(DOMAINS):]
    listed, inflight, dispatched, leased, pending, delayed, owners, fails, lost, dead, queued = rest
    # The job knows every item by its fingerprint: a live one in its bucket (named by the key its
    # state puts it in), a done one in the seen set.
    buckets = list(tracker.client.scan_iter(match=k.seen_buckets + "*"))
    seen = len(items) + sum(tracker.client.scard(b) for b in buckets)
    return Snapshot(
        states={i: v[0] for i, v in items.items()},
        depths={i: int(v[1:]) % DEPTH_SPAN for i, v in items.items()},
        priorities={i: int(v[1:]) // DEPTH_SPAN for i, v in items.items()},
        queues={d: q for d, q in queues.items() if q}, listed=set(listed),
        inflight={d: int(n) for d, n in inflight.items()},
        dispatched=dict(dispatched), leased=dict(leased), pending=dict(pending),
        delayed=dict(delayed),
        owners={i: (o.split(" ")[0], int(o.split(" ")[1])) for i, o in owners.items()},
        fails={i: int(n) for i, n in fails.items() if int(n)},
        lost={i: int(n) for i, n in lost.items() if int(n)},
        dead=dead, queued=int(queued or 0), seen=seen,
    )


# -- the model -----------------------------------------------------------------------------------


@dataclass
class Item:
    state: str  # q queued, w delayed, d dispatched, l leased, s save pending, S saving, D done, X dead
    depth: int
    fails: int = 0  # attempts that were the item's fault
    lost: int = 0  # holders that vanished
    owner: Optional[tuple[str, int]] = None  # (worker, token) of an l, s or S item
    expired: bool = False  # its deadline (or due time) was forced into the past
    tokens: list[int] = field(default_factory=list)  # every token it was ever leased under
    reason: Optional[str] = None  # why it is dead
    cause: Optional[str] = None  # what made it dead: item, lost, or refused (not retryable)
    completed: int = 0  # complete() calls that changed it
    priority: int = 0
    # Its place among the queued items of its priority: lower goes first. Items put back at the
    # head of their queue take ever lower numbers, those queued at the back ever higher; items
    # queued by one call in an order the model does not know share one.
    arrival: int = 0
    # Of priority 0, leased straight from its queue once: its stale entry in its domain's list
    # may bring it out again at its old place, so its place is not checked.
    unplaced: bool = False


class TrackerMachine(RuleBasedStateMachine):
    redis_url: Optional[str] = None  # set on the Redis subclass

    def __init__(self) -> None:
        super().__init__()
        self.t: Optional[Tracker] = None
        self.clock = FakeClock()
        self.client: Optional[redis.Redis] = None
        if self.redis_url:
            self.client = redis.Redis.from_url(self.redis_url, decode_responses=True)
            self.client.flushdb()
        self.items: dict[str, Item] = {}
        self.workers: dict[str, list] = {}  # id -> [concurrency, alive]
        self.final: dict[str, str] = {}  # item -> D or X, once it got there
        self.last_token = 0
        self.expiries = itertools.count(1)
        self.hosts = itertools.count(1)
        self.job_state = JobState.RUNNING
        self.arrivals = itertools.count(1)

    def teardown(self) -> None:
        if isinstance(self.t, RedisTracker):
            self.t.client.close()
        if self.client is not None:
            self.client.close()

    # -- model helpers ---------------------------------------------------------------------

    def live(self) -> list[str]:
        return [w for w, (_, alive) in self.workers.items() if alive]

    def slots(self) -> int:
        return sum(c for c, alive in self.workers.values() if alive)

    def bound(self) -> int:
        """Scrape messages the broker may hold: a share of the slots, at least one."""
        return max(1, math.ceil(self.factor * self.slots())) if self.slots() else 0

    def save_bound(self) -> int:
        return self.save_factor * self.slots()

    def count(self, states: str) -> int:
        return sum(it.state in states for it in self.items.values())

    @staticmethod
    def dom(item: str) -> str:
        return keys.domain_of(item)

    def in_domain(self, dom: str, states: str) -> int:
        return sum(it.state in states and self.dom(i) == dom for i, it in self.items.items())

    def inflight(self, dom: str) -> int:
        return self.in_domain(dom, "dl")  # messages and fetches under way

    def dispatchable(self, dom: str) -> int:
        """How many of the domain's items a dispatch may take: up to its cap, none of the slow
        domain's once its slot is taken (its turn is an hour away)."""
        if dom == SLOW and self.slow_closed:
            return 0
        return max(0, min(self.in_domain(dom, "q"), self.caps[dom] - self.inflight(dom)))

    def in_state(self, states: str) -> list[str]:
        return sorted(i for i, it in self.items.items() if it.state in states)

    def step(self) -> None:
        """Time passes (one second on the fake clock) and every live worker beats."""
        self.clock.now += 1
        for w in self.live():
            self.t.heartbeat(w)

    def place(self, front: bool) -> int:
        """A new place in the queues: ahead of every other (``front``) or behind them."""
        n = next(self.arrivals)
        return -n if front else n

    def add_model(self, found: list[str], depth: int, priorities=None) -> int:
        added = 0
        room = self.max_pages - len(self.items) if self.max_pages is not None else None
        for item in found:
            if room is not None and added >= room:
                break
            seen = sum(self.dom(i) == self.dom(item) for i in self.items)
            if self.per_domain is not None and seen >= self.per_domain:
                continue
            if item not in self.items:
                priority = priorities[found.index(item)] if priorities else 0
                self.items[item] = Item("q", depth, priority=priority,
                                        arrival=self.place(False))
                added += 1
        if added and self.job_state is JobState.FINISHED:
            self.job_state = JobState.RUNNING  # new work: the job runs again
        return added

    def took(self, dispatch: list[str]) -> None:
        """Check what a call handed out for dispatch: first, backed-off items whose time came are
        queued again; then exactly enough queued items to fill the broker up to its bound of
        scrape messages, while the save pages are under theirs, as far as the domains' caps
        allow, each once; they become dispatched."""
        due = self.place(False)  # queued again by one call, in the order of their due times
        for it in self.items.values():
            if it.state == "w" and it.expired:
                it.state, it.expired, it.arrival = "q", False, due
        room = min(self.bound() - self.count("d"), self.save_bound() - self.count("s"),
                   MAX_DISPATCH_BATCH)
        if self.held():
            room = 0
        able = {d: self.dispatchable(d) for d in DOMAINS}
        want = max(0, min(room, sum(able.values())))
        assert len(dispatch) == want, (dispatch, want, self.bound(), able)
        assert len(set(dispatch)) == len(dispatch), dispatch
        for dom, n in Counter(self.dom(i) for i in dispatch).items():
            assert n <= able[dom], (dom, n, able)
        self.check_order(dispatch)
        for item in dispatch:
            it = self.items[item]
            assert it.state == "q", (item, it)
            it.state, it.expired = "d", False

    def check_order(self, dispatch: list[str]) -> None:
        """The order rule: within a domain, the items handed out come highest priority first,
        and none waits that has a higher one; among equal priorities, first come first served
        (items of priority 0 that the model cannot place aside)."""
        taken: dict[str, list[str]] = defaultdict(list)
        for item in dispatch:
            taken[self.dom(item)].append(item)
        for dom, items in taken.items():
            waiting = [self.items[i] for i in self.in_state("q")
                       if self.dom(i) == dom and i not in items]
            out = [self.items[i] for i in items]
            assert [it.priority for it in out] == sorted(
                (it.priority for it in out), reverse=True), (dom, items)
            last = out[-1].priority
            assert all(it.priority <= last for it in waiting), (dom, items, waiting)

            def places(its, priority):
                return [it.arrival for it in its if it.priority == priority and not it.unplaced]

            for priority in {it.priority for it in out}:
                mine = places(out, priority)
                assert mine == sorted(mine), (dom, items, priority)
            later = places(waiting, last)
            mine = places(out, last)
            assert not mine or not later or max(mine) <= min(later), (dom, items, waiting)

    def held(self) -> bool:
        return self.job_state in (JobState.PAUSED, JobState.CANCELLED)

    def requeue(self, it: Item, front: bool = False, place: Optional[int] = None) -> None:
        it.state, it.owner, it.expired = "q", None, False
        it.arrival = self.place(front) if place is None else place

    def give_up(self, item: str, reason: str, cause: str) -> None:
        it = self.items[item]
        it.state, it.owner, it.expired = "X", None, False
        it.reason, it.cause = reason[:MAX_REASON], cause
        self.final[item] = "X"

    def retry_or_dead(self, item: str, fault: Fault, retryable: bool, max_retries: int,
                      reason: str, delay: float = 0.0, front: bool = False,
                      place: Optional[int] = None) -> str:
        """retry_or_dead of _lib.lua."""
        it = self.items[item]
        over = False
        if fault is Fault.ITEM:
            it.fails += 1
            over = it.fails > max_retries
        elif fault is Fault.LOST:
            it.lost += 1
            over = it.lost > self.max_lost
        if retryable and not over:
            self.requeue(it, front, place)
            if delay > 0:
                it.state = "w"  # waits out its backoff in the delayed set
            return "retry"
        self.give_up(item, reason, fault.value if over else "refused")
        return "dead"

    def holds(self, item: str, token: int) -> bool:
        it = self.items.get(item)
        return it is not None and it.owner is not None and it.owner[1] == token

    def draw_token(self, data, item: str) -> int:
        """Mostly the item's current token; else one it had before (stale) or one never issued."""
        it = self.items.get(item)
        current = [it.owner[1]] * 4 if it is not None and it.owner else []
        old = it.tokens if it is not None else []
        return data.draw(st.sampled_from(current + old + [BOGUS_TOKEN]), label="token")

    def draw_item(self, data, preferred: list[str]) -> str:
        """Mostly one of ``preferred``; sometimes any item seen, or one never added."""
        pool = preferred * 8 + sorted(self.items) + [GHOST]
        return data.draw(st.sampled_from(pool), label="item")

    # -- set-up ----------------------------------------------------------------------------

    @initialize(
        concurrency=st.lists(st.integers(1, 2), min_size=1, max_size=3),
        factor=st.sampled_from([0.25, 0.5, 1, 2]), save_factor=st.integers(1, 2),
        max_retries=st.integers(0, 2), max_lost=st.integers(0, 2),
        seeds=st.lists(st.sampled_from(UNIVERSE), min_size=1, max_size=6),
        cap=st.integers(1, 3), b_cap=st.integers(1, 3),
        max_pages=st.sampled_from([None, None, 6, 10]), per_domain=st.sampled_from([None, None, 2, 3]),
    )
    def start(self, concurrency, factor, save_factor, max_retries, max_lost, seeds, cap, b_cap,
              max_pages, per_domain):
        self.factor, self.save_factor = factor, save_factor
        self.max_retries, self.max_lost = max_retries, max_lost
        self.max_pages, self.per_domain = max_pages, per_domain
        self.caps = {d: cap for d in DOMAINS}
        self.caps.update({"b.invalid": b_cap, SLOW: 2})
        self.slow_closed = False
        limits = CrawlLimits(
            default=DomainLimits(concurrency=cap),
            overrides={"b.invalid": DomainLimits(concurrency=b_cap), SLOW: DomainLimits(concurrency=2)},
            max_pages=max_pages, max_pages_per_domain=per_domain,
        )
        if self.redis_url:
            self.t = RedisTracker.from_url(
                self.redis_url, lease_seconds=LEASE, dispatch_factor=factor,
                save_backlog_factor=save_factor, bound_refresh_seconds=0,
            )
        else:
            self.t = InMemoryTracker(lease_seconds=LEASE, dispatch_factor=factor,
                                     save_backlog_factor=save_factor, bound_refresh_seconds=0,
                                     clock=self.clock)
        assert self.t.create_job(JOB, SPEC, limits)
        for c in concurrency:
            self.workers[self.t.register_worker("host", next(self.hosts), c)] = [c, True]
        # The slow domain's two items go out; then its robots.txt asks for an hour between
        # fetches, and the first fetch takes its slot: every later checkout of it is throttled.
        # The helper's slots let the broker take both at once.
        helper_slots = max(2, math.ceil(2 / factor))
        helper = self.t.register_worker("host", next(self.hosts), helper_slots)
        self.workers[helper] = [helper_slots, True]
        res = self.t.add(JOB, SLOW_ITEMS)
        assert res.added == self.add_model(SLOW_ITEMS, 0)
        self.took(res.dispatch)
        assert sorted(res.dispatch) == sorted(SLOW_ITEMS)
        self.t.set_domain_delay(JOB, SLOW, LEASE)
        self.do_checkout(SLOW_ITEMS[0], helper)
        self.slow_closed = True
        assert self.items[SLOW_ITEMS[0]].state == "l"
        res = self.t.add(JOB, seeds)
        assert res.added == self.add_model(seeds, 0)
        self.took(res.dispatch)

    # -- workers ---------------------------------------------------------------------------

    def start_worker(self, concurrency: int) -> None:
        if len(self.workers) < MAX_WORKERS:
            w = self.t.register_worker("host", next(self.hosts), concurrency)
            assert w not in self.workers
            self.workers[w] = [concurrency, True]

    @precondition(lambda self: len(self.live()) < 3)
    @rule(concurrency=st.integers(1, 2))
    def worker_starts(self, concurrency):
        self.step()
        self.start_worker(concurrency)

    @precondition(lambda self: self.live())
    @rule(data=st.data(), maintain=st.booleans(), replaced=st.booleans())
    def worker_dies(self, data, maintain, replaced):
        """It stops beating and its leases run out; maybe a live worker's maintenance runs at
        once, and maybe a new worker takes its place."""
        self.step()
        w = data.draw(st.sampled_from(self.live()), label="worker")
        stop_heartbeats(self.t, w)
        self.workers[w][1] = False
        for item in self.in_state("lS"):
            if self.items[item].owner[0] == w:
                self.expire(item)
        if maintain:
            self.do_maintain()
        if replaced:
            self.start_worker(1)

    def releasable(self) -> list[str]:
        """Workers a release(job, worker) makes sense for: a live one stopping, or a dead one
        whose items are given back by hand."""
        owners = {it.owner[0] for it in self.items.values() if it.owner}
        return sorted(w for w, (_, alive) in self.workers.items() if alive or w in owners)

    @precondition(lambda self: self.releasable())
    @rule(data=st.data(), replaced=st.booleans())
    def worker_stops(self, data, replaced):
        """release(job, worker, saves): a stopping worker gives back what it scrapes or saves,
        and every dispatched item, at once and counting nothing; the save messages it names (some of its save-pending items,
        maybe with a stale token) go back to the broker, whose wait for them starts again; any
        other save-pending item it holds has no message and is queued again. Then it
        deregisters, and maybe a new worker takes its place."""
        self.step()
        w = data.draw(st.sampled_from(self.releasable()), label="worker")
        mine = sorted(i for i, it in self.items.items()
                      if it.state == "s" and it.owner and it.owner[0] == w)
        named = data.draw(st.lists(st.sampled_from(mine), unique=True) if mine else st.just([]),
                          label="reserved saves")
        stale = set(data.draw(st.lists(st.sampled_from(named), unique=True) if named
                              else st.just([]), label="of them stale"))
        saves = [(i, self.items[i].owner[1] + (1000 if i in stale else 0)) for i in named]
        n = self.t.release(JOB, w, saves)
        want = 0
        back = self.place(True)  # each at the head of its queue, in an order of its own
        for i, it in self.items.items():
            if it.owner and it.owner[0] == w:
                if it.state == "s" and i in named and i not in stale:
                    # Waits for its message a save timeout from now, in the broker's hands.
                    it.owner, it.expired = ("-", it.owner[1]), False
                elif it.state in "lSs":
                    self.requeue(it, place=back)
                    want += 1
            elif it.state == "d":  # names no worker: may be one it never sent
                self.requeue(it, place=back)
                want += 1
        assert n == want
        if self.workers[w][1]:
            self.t.deregister_worker(w)
            self.workers[w][1] = False
        if replaced:
            self.start_worker(2)

    @precondition(lambda self: not self.live())
    @rule()
    def crawl_resumes(self):
        """release(job) while no worker runs the job (a stopped one-machine crawl resuming):
        every in-flight item goes back to the frontier, counting nothing; a worker starts."""
        self.step()
        n = self.t.release(JOB)
        want = 0
        back = self.place(True)
        for it in self.items.values():
            if it.state in IN_FLIGHT:
                self.requeue(it, place=back)
                want += 1
        assert n == want
        self.start_worker(2)

    # -- items -----------------------------------------------------------------------------

    @rule(items=st.lists(st.sampled_from(UNIVERSE), max_size=4), depth=st.integers(0, 3),
          priority=PRIORITIES)
    def add(self, items, depth, priority):
        self.step()
        res = self.t.add(JOB, items, depth, priority)
        assert res.added == self.add_model(items, depth, [priority] * len(items))
        self.took(res.dispatch)

    @precondition(lambda self: self.live() and self.in_state("dlsS"))
    @rule(data=st.data(), found=st.lists(st.sampled_from(UNIVERSE), max_size=3),
          depth=st.integers(0, 3), flaky=st.sampled_from([False] * 3 + [True]),
          priorities=st.lists(PRIORITIES, min_size=3, max_size=3))
    def progress(self, data, found, depth, flaky, priorities):
        """The normal next step of one in-flight item: a live worker takes its scrape message,
        the holder reports it scraped (with what it found) or, now and then, that the download
        failed (the item's fault, retryable), its save starts, the save is done."""
        self.step()
        item = data.draw(st.sampled_from(self.in_state("dlsS")), label="item")
        it = self.items[item]
        w = data.draw(st.sampled_from(self.live()), label="worker")
        if it.state == "d":
            self.do_checkout(item, w)
        elif it.state == "l" and flaky:
            self.do_fail(item, it.owner[1], Fault.ITEM, True, "HTTP 503",
                         delay=data.draw(st.sampled_from([0.0, LEASE]), label="delay"))
        elif it.state == "l":
            self.do_scraped(item, it.owner[1], found, depth, priorities[:len(found)])
        elif it.state == "s":
            self.do_begin_save(item, it.owner[1], w)
        else:
            self.do_complete(item)

    @precondition(lambda self: self.live() and self.items)
    @rule(data=st.data())
    def checkout(self, data):
        """A message for an item in any state (a duplicate, a redelivery), or one never added."""
        self.step()
        w = data.draw(st.sampled_from(self.live()), label="worker")
        self.do_checkout(self.draw_item(data, self.in_state("dlsS")), w)

    @precondition(lambda self: self.in_state("l"))
    @rule(data=st.data(), found=st.lists(st.sampled_from(UNIVERSE), max_size=3),
          depth=st.integers(0, 3), priorities=st.lists(PRIORITIES, min_size=3, max_size=3))
    def scraped(self, data, found, depth, priorities):
        self.step()
        item = self.draw_item(data, self.in_state("l"))
        self.do_scraped(item, self.draw_token(data, item), found, depth, priorities[:len(found)])

    @precondition(lambda self: self.in_state("lsS") and self.live())
    @rule(data=st.data())
    def begin_save(self, data):
        self.step()
        w = data.draw(st.sampled_from(self.live()), label="worker")
        item = self.draw_item(data, self.in_state("lsS"))
        self.do_begin_save(item, self.draw_token(data, item), w)

    @precondition(lambda self: self.in_state("S"))
    @rule(data=st.data())
    def defer_save(self, data):
        self.step()
        item = self.draw_item(data, self.in_state("S"))
        self.do_defer_save(item, self.draw_token(data, item))

    def do_defer_save(self, item: str, token: int) -> None:
        ok = self.t.defer_save(JOB, item, token)
        it = self.items.get(item)
        want = it is not None and it.state == "S" and self.holds(item, token)
        assert ok is want
        if want:
            it.state, it.expired = "s", False

    @precondition(lambda self: self.items)
    @rule(data=st.data())
    def complete(self, data):
        """A save finished: of a saving item, or a late one (the item was handed on since)."""
        self.step()
        self.do_complete(self.draw_item(data, self.in_state("S")))

    def do_checkout(self, item: str, w: str) -> None:
        co = self.t.checkout(JOB, item, w, max_lost=self.max_lost)
        it = self.items.get(item)
        if it is None:
            assert (co.status, co.depth, co.failed_attempts, co.token, co.dispatch) == (
                LeaseStatus.UNKNOWN, 0, 0, 0, [])
            return
        # A done item's depth is forgotten (it lives on only as a fingerprint).
        depth = 0 if it.state == "D" else it.depth
        assert (co.depth, co.failed_attempts) == (depth, it.fails), (co, it)
        expected = {
            "D": LeaseStatus.DONE, "X": LeaseStatus.DEAD, "s": LeaseStatus.BUSY,
            "w": LeaseStatus.BUSY,  # waits out its backoff
        }.get(it.state)
        if it.state in "lS":
            if not it.expired:
                expected = LeaseStatus.BUSY  # a live lease: nobody else gets it
            elif self.retry_or_dead(
                item, Fault.LOST, True, 0,
                f"its worker vanished too often (last holder {it.owner[0]})", front=True,
            ) == "dead":
                expected = LeaseStatus.DEAD
        if expected is not None:
            assert (co.status, co.token, co.dispatch) == (expected, 0, []), (co, it)
            return
        dom = self.dom(item)
        if self.held():
            # Paused or cancelled: a delivered item goes back to the head of its queue.
            assert (co.status, co.token, co.dispatch) == (LeaseStatus.HELD, 0, []), (co, it)
            if it.state == "d":
                it.arrival = self.place(True)
            it.state, it.expired = "q", False
            return
        if (dom == SLOW and self.slow_closed) or (
            it.state == "q" and self.inflight(dom) >= self.caps[dom]
        ):
            # Its domain's slot is taken, or (leased straight from its queue) its domain is at
            # its cap: it goes back to the head of its queue, the caller's slot is free.
            assert (co.status, co.token) == (LeaseStatus.THROTTLED, 0), (co, it)
            assert (co.wait > 0) is (dom == SLOW), co
            if it.state == "d":
                it.arrival = self.place(True)
            it.state, it.expired = "q", False
            self.took(co.dispatch)
            return
        assert co.status is LeaseStatus.OK, (co, it)
        assert co.token > self.last_token, (co.token, self.last_token)  # a new fencing token
        self.last_token = co.token
        if it.state == "q" and it.priority == 0:
            it.unplaced = True  # leased straight from its queue: its list entry goes stale
        it.tokens.append(co.token)
        it.state, it.owner, it.expired = "l", (w, co.token), False
        self.took(co.dispatch)

    def do_scraped(self, item: str, token: int, found: list[str], depth: int,
                   priorities: Optional[list[int]] = None) -> None:
        res = self.t.scraped(JOB, item, token, found, depth, priorities=priorities or ())
        # The finds are queued whoever reports them; the item moves only for its holder.
        held = item in self.items and self.items[item].state == "l" and self.holds(item, token)
        assert res.added == self.add_model(found, depth, priorities)
        assert res.held is held
        if held:
            it = self.items[item]
            # Its save message is in the broker: no worker holds it, the token stays.
            it.state, it.owner, it.expired = "s", ("-", token), False
        self.took(res.dispatch)

    def do_begin_save(self, item: str, token: int, w: str) -> None:
        res = self.t.begin_save(JOB, item, token, w, max_lost=self.max_lost)
        it = self.items.get(item)
        if it is None:
            assert (res.status, res.lost, res.dispatch) == (SaveStart.UNKNOWN, 0, [])
            return
        expected = {"D": SaveStart.DONE, "X": SaveStart.DEAD}.get(it.state)
        if expected is None and (not self.holds(item, token) or it.state not in HELD):
            expected = SaveStart.STALE  # a late save may still complete it
        if expected is None and it.state == "S" and not it.expired:
            expected = SaveStart.BUSY  # a run of it holds a live lease: a duplicate delivery
        elif expected is None and it.state == "S":
            it.lost += 1  # the save under this token already ran: its process vanished
            if it.lost > self.max_lost:
                self.give_up(
                    item, f"its save was interrupted {it.lost} times: the worker process died "
                    "while saving it (out of memory, or a crashing saver?)", "lost",
                )
                expected = SaveStart.DEAD
        if expected is not None:
            assert (res.status, res.lost, res.dispatch) == (expected, it.lost, []), (res, it)
            return
        assert (res.status, res.lost) == (SaveStart.OK, it.lost), (res, it)
        it.state, it.owner, it.expired = "S", (w, token), False
        self.took(res.dispatch)

    def do_complete(self, item: str) -> None:
        res = self.t.complete(JOB, item)
        it = self.items.get(item)
        want = it is not None and it.state not in "DX"
        assert res.changed is want, (item, it)
        if want:
            it.state, it.owner, it.expired = "D", None, False
            it.fails = it.lost = 0
            it.completed += 1
            self.final[item] = "D"
        self.took(res.dispatch)

    @precondition(lambda self: self.in_state(HELD))
    @rule(data=st.data(), fault=st.sampled_from(Fault),
          retryable=st.sampled_from([True] * 3 + [False]), reason=st.sampled_from(REASONS),
          delay=st.sampled_from([0.0, 0.0, LEASE]))
    def fail(self, data, fault, retryable, reason, delay):
        """A failed attempt, retried at once or (backoff) after a delay longer than any example."""
        self.step()
        item = self.draw_item(data, self.in_state(HELD))
        self.do_fail(item, self.draw_token(data, item), fault, retryable, reason, delay)

    def do_fail(self, item: str, token: int, fault: Fault, retryable: bool, reason: str,
                delay: float = 0.0) -> None:
        res = self.t.fail(JOB, item, token, reason, fault=fault, max_retries=self.max_retries,
                          max_lost=self.max_lost, retryable=retryable, delay=delay)
        want = FailOutcome.IGNORED
        if item in self.items and self.items[item].state in HELD and self.holds(item, token):
            want = FailOutcome(
                self.retry_or_dead(item, fault, retryable, self.max_retries, reason, delay)
            )
        assert res.outcome is want, (res, self.items.get(item))
        self.took(res.dispatch)

    def stale_tokens(self) -> list[tuple[str, int]]:
        return [(i, t) for i, it in sorted(self.items.items()) for t in it.tokens
                if not self.holds(i, t)]

    @precondition(lambda self: self.stale_tokens())
    @rule(data=st.data(), op=st.sampled_from(["fail", "scraped", "begin_save", "defer_save"]),
          fault=st.sampled_from(Fault), retryable=st.booleans(),
          found=st.lists(st.sampled_from(UNIVERSE), max_size=2), saved=st.booleans())
    def late_holder(self, data, op, fault, retryable, found, saved):
        """A holder whose item moved on since (reclaimed, released, taken over, done, dead)
        reports under its old token: that changes nothing but queue its finds; a late save that
        succeeds still completes the item."""
        self.step()
        item, token = data.draw(st.sampled_from(self.stale_tokens()), label="stale")
        if op == "fail":
            self.do_fail(item, token, fault, retryable, "late")
        elif op == "scraped":
            self.do_scraped(item, token, found, 1)
        elif op == "defer_save":
            self.do_defer_save(item, token)
        else:
            w = data.draw(st.sampled_from(sorted(self.workers)), label="worker")  # maybe a dead one
            self.do_begin_save(item, token, w)
            if saved:
                self.do_complete(item)

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def extend(self, data):
        """A live worker's heartbeat of the items it holds and the save messages it reserved."""
        self.step()
        w = data.draw(st.sampled_from(self.live()), label="worker")
        pool = self.in_state("dlS") * 4 + sorted(self.items) + [GHOST]
        items = data.draw(st.lists(st.sampled_from(pool), unique=True, max_size=4), label="items")
        pending = self.in_state("s")
        saves = []
        if pending:
            for item in data.draw(st.lists(st.sampled_from(pending), unique=True, max_size=2),
                                  label="saves"):
                saves.append((item, self.draw_token(data, item)))
        n = self.t.extend(JOB, items, w, saves)
        low = high = 0
        for item in items:
            it = self.items.get(item)
            if it is not None and (it.state == "d" or (it.state in "lS" and it.owner[0] == w)):
                high += 1
                low += it.expired
                it.expired = False
        for item, token in saves:
            it = self.items[item]
            if self.holds(item, token):  # the message now depends on this worker's heartbeat
                low, high = low + 1, high + 1
                it.owner, it.expired = (w, token), False
        # A deadline counts when it moved later: on the fake clock every one set before this
        # step does; on Redis's clock, too, unless TIME stood still between two calls.
        if isinstance(self.t, InMemoryTracker):
            assert n == high, (n, high)
        else:
            assert low <= n <= high, (n, low, high)

    def expire(self, item: str) -> None:
        force_expire(self.t, JOB, item, PAST + next(self.expiries))
        self.items[item].expired = True

    @precondition(lambda self: any(not self.items[i].expired for i in self.in_state("dlsS")))
    @rule(data=st.data(), redelivered=st.booleans())
    def deadline_passes(self, data, redelivered):
        """One in-flight item's lease, save wait or dispatch runs out; maybe a message for it
        reaches a live worker before any maintenance ran (a lease is then taken over)."""
        self.step()
        item = data.draw(st.sampled_from(
            [i for i in self.in_state("dlsS") if not self.items[i].expired]), label="item")
        self.expire(item)
        if redelivered and self.live():
            self.do_checkout(item, data.draw(st.sampled_from(self.live()), label="worker"))

    def do_maintain(self) -> None:
        res = self.t.maintain(JOB, max_lost=self.max_lost)
        outcomes: Counter = Counter()
        back = self.place(True)  # reclaimed items go to the head of their queues
        for item in self.in_state("S"):  # a dead saving run: back to waiting for its save
            it = self.items[item]
            if it.expired:
                it.lost += 1
                if it.lost > self.max_lost:
                    self.give_up(item, f"its save was interrupted too often (last holder "
                                 f"{it.owner[0]})", "lost")
                    outcomes["dead"] += 1
                else:
                    it.state, it.owner, it.expired = "s", ("-", it.owner[1]), False
                    outcomes["retry"] += 1
        for states, fault, why in (
            ("l", Fault.LOST, "its worker vanished"),
            ("s", Fault.LOST, "its save message was lost"),
            ("d", Fault.FREE, ""),
        ):
            for item in self.in_state(states):
                it = self.items[item]
                if it.expired:
                    was = it.owner[0] if it.owner else "?"
                    outcome = self.retry_or_dead(
                        item, fault, True, 0, f"{why} too often (last holder {was})", place=back)
                    # A dispatch that expired is requeued, counted apart from lost holders.
                    outcomes["requeued" if states == "d" and outcome == "retry" else outcome] += 1
        assert (res.reclaimed, res.died, res.requeued) == (
            outcomes["retry"], outcomes["dead"], outcomes["requeued"]), res
        ends = self.job_state is JobState.RUNNING and self.items and not self.count("qwdlsS")
        assert res.finished is bool(ends), (res, self.job_state)  # detected once
        if ends:
            self.job_state = JobState.FINISHED
        self.took(res.dispatch)

    @rule()
    def maintain(self):
        self.step()
        self.do_maintain()

    @precondition(lambda self: any(not self.items[i].expired for i in self.in_state("w")))
    @rule(data=st.data(), maintain=st.booleans())
    def backoff_ends(self, data, maintain):
        """A delayed retry's time comes: the next dispatch (of any call) queues it again."""
        self.step()
        item = data.draw(st.sampled_from(
            [i for i in self.in_state("w") if not self.items[i].expired]), label="item")
        self.expire(item)
        if maintain:
            self.do_maintain()

    @precondition(lambda self: self.in_state("X"))
    @rule()
    def retry_dead(self):
        """distscrape retry-dead: every dead item is queued again with fresh counters."""
        self.step()
        res = self.t.retry_dead(JOB)
        dead = self.in_state("X")
        assert res.requeued == len(dead)
        again = self.place(False)
        for item in dead:
            it = self.items[item]
            self.requeue(it, place=again)
            it.fails = it.lost = 0
            it.reason = it.cause = None
            del self.final[item]
        if dead and self.job_state is JobState.FINISHED:
            self.job_state = JobState.RUNNING
        self.took(res.dispatch)

    @rule(action=st.sampled_from(JobAction))
    def control(self, action):
        """distscrape pause, resume or cancel."""
        self.step()
        before = self.job_state
        if before is JobState.FINISHED and action is not JobAction.RESUME:
            with pytest.raises(JobStateError):
                self.t.control(JOB, action)
            return
        res = self.t.control(JOB, action)
        after = {
            (JobAction.PAUSE, JobState.RUNNING): JobState.PAUSED,
            (JobAction.CANCEL, JobState.RUNNING): JobState.CANCELLED,
            (JobAction.CANCEL, JobState.PAUSED): JobState.CANCELLED,
            (JobAction.RESUME, JobState.PAUSED): JobState.RUNNING,
            (JobAction.RESUME, JobState.CANCELLED): JobState.RUNNING,
        }.get((action, before), before)
        assert (res.before, res.after) == (before, after), res
        self.job_state = after
        self.took(res.dispatch)

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def every_item_in_exactly_one_state(self):
        if self.t is None:
            return
        snap = snapshot(self.t, JOB)
        live = {i for i, it in self.items.items() if it.state != "D"}
        assert set(snap.states) == live, "an item was lost or made up"
        assert snap.seen == len(self.items), "the seen set lost or made up an item"
        sets = {"dispatched": snap.dispatched, "leased": snap.leased, "pending": snap.pending,
                "delayed": snap.delayed}
        for item, it in self.items.items():
            if it.state == "D":  # done: no per-item entry is left, only its fingerprint
                assert not any(item in m for m in (*sets.values(), snap.owners, snap.fails,
                                                   snap.lost, snap.dead)), item
                continue
            assert (snap.states[item], snap.depths[item], snap.priorities[item]) == (
                it.state, it.depth, it.priority), (item, it)
            where = [name for name, members in sets.items() if item in members]
            assert where == ([TIMED[it.state]] if it.state in TIMED else []), (item, where)
            if where:
                expired = sets[where[0]][item] < EXPIRED_BELOW
                assert expired is it.expired, (item, it, sets[where[0]][item])
            if it.state == "q":
                assert item in snap.queues.get(self.dom(item), []), item
            assert snap.owners.get(item) == it.owner, (item, snap.owners.get(item), it)
            assert it.owner is None or it.owner[1] == it.tokens[-1], it  # one valid token
            assert (snap.fails.get(item, 0), snap.lost.get(item, 0)) == (it.fails, it.lost), it
            if item in self.final:  # done and dead are final
                assert snap.states[item] == self.final[item], (item, it)
        for dom, queue in snap.queues.items():
            assert {self.dom(i) for i in queue} == {dom}, (dom, queue)
            assert set(queue) <= set(self.items)
        assert snap.queued == self.count("q")
        # In-flight counts per domain, and the domains listed for dispatch: exactly those with
        # a queue and room under their cap.
        assert snap.inflight == {d: self.inflight(d) for d in DOMAINS if self.inflight(d)}
        for dom in DOMAINS:
            listed = dom in snap.queues and self.inflight(dom) < self.caps[dom]
            assert (dom in snap.listed) is listed, (dom, snap.listed, snap.queues)
            assert self.inflight(dom) <= self.caps[dom], dom
        assert set(snap.owners) == set(self.in_state(HELD))

    @invariant()
    def retries_and_deaths_follow_the_rules(self):
        if self.t is None:
            return
        for item, it in self.items.items():
            assert it.fails <= self.max_retries + 1 and it.lost <= self.max_lost + 1, it
            assert it.completed <= 1, it  # never done twice
            assert (it.state == "D") is (it.completed == 1), it
            if it.state == "X":
                assert it.reason, it
                assert {
                    "item": it.fails > self.max_retries,
                    "lost": it.lost > self.max_lost,
                    "refused": True,  # not retryable: dead at the first failure
                }[it.cause], it
            elif it.state != "D":
                assert it.fails <= self.max_retries and it.lost <= self.max_lost, it

    @invariant()
    def job_state_and_active_set_agree(self):
        if self.t is None:
            return
        assert self.t.job_info(JOB).state is self.job_state
        maintained = self.job_state in (JobState.RUNNING, JobState.PAUSED)
        assert self.t.active_jobs() == ([JOB] if maintained else [])

    @invariant()
    def counters_add_up(self):
        if self.t is None:
            return
        s = self.t.stats(JOB)
        assert s.seen == len(self.items)
        by_state = (self.count("q"), self.count("w"), self.count("d"), self.count("lS"),
                    self.count("s"), self.count("D"), self.count("X"))
        assert (s.frontier, s.delayed, s.dispatched, s.leased, s.save_pending, s.done, s.dead) == \
            by_state, s
        assert (s.frontier + s.delayed + s.dispatched + s.leased + s.save_pending + s.done + s.dead
                == s.seen)
        assert s.finished is (s.seen > 0 and self.count("qwdlsS") == 0)
        dead = {i: it.reason for i, it in self.items.items() if it.state == "X"}
        assert self.t.dead_items(JOB, limit=100) == dead
        assert dict(self.t.iter_dead(JOB)) == dead
        assert self.t.dispatch_bound() == self.bound()


# Both kinds run the same Lua scripts; the in-memory tracker's fake Redis takes 2-4 times as long
# a step as a real Redis. The in-memory run adds exact deadlines (its fake clock).
# 150 runs of the machine a kind, in PARTS tests of their own (each with its own random seed) so
# that the test processes share them instead of one process waiting on all of them.
EXAMPLES, PARTS = 150, 3
SETTINGS = settings(max_examples=EXAMPLES // PARTS, stateful_step_count=50, deadline=None,
                    database=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("part", range(PARTS))
@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_tracker_follows_the_model(kind, part, request):
    url = request.getfixturevalue("redis_url") if kind == "redis" else None
    machine = type(f"{kind.title()}TrackerMachine", (TrackerMachine,), {"redis_url": url})
    run_state_machine_as_test(machine, settings=SETTINGS)
