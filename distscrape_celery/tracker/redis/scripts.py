"""The tracker's Lua scripts (``lua/``), read from the package once per process.

An item script is the library (the files of LIBRARY, joined in that order), then ``_begin.lua``
(the call's keys, the job checked), then its own file; the others stand alone. The batch script (BATCH) runs several calls of the scripts in
BATCH_SCRIPTS in one call, each file as a function. Redis runs the item scripts in one of two
forms of the same text:

- a **function library** (Redis 7 and later): the library and every item script are loaded once
  with FUNCTION LOAD and called with FCALL, so a call does not build the library's ~50 closures
  and tables again; its name carries a hash of its text, so two versions of distscrape can share
  a Redis;
- a **script** per item script (EVALSHA), the library first: for Redis 6.2, a Redis Cluster, a
  server that refuses FUNCTION LOAD, and the in-memory tracker.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from importlib import resources
from collections.abc import Iterable
from typing import Any

from redis.commands.core import Script

from ..model import Urgent

# The scripts on a job's items: each runs on one shard's keys and raises NOJOB for a missing job.
ITEM_SCRIPTS = (
    "add", "checkout", "scraped", "begin_save", "defer_save", "complete", "fail", "extend",
    "maintain", "release", "retry_dead", "control", "handoff", "unclaimed_saves", "expire_saves",
    "generation", "changed",
)
# The item scripts whose calls go together in one call of BATCH: what a save batch calls for all
# its pages, and what threads of a process call at the same time (combine.py).
BATCH_SCRIPTS = ("begin_save", "complete", "checkout", "scraped")
BATCH = "batch"
# The item keys every item script takes (KEYS[1] to KEYS[21], see _lib_call.lua).
ITEM_KEYS = 21
# The library the item scripts share, one file per section, in the order they are joined: each
# file uses only what those before it define (a Lua local is seen only below its definition).
LIBRARY = (
    "_lib_call",  # the call's keys and caches, Redis's clock, numbers as text
    "_lib_job",  # the job's counters and state
    "_lib_politeness",  # domains: limits, turns, head starts, in-flight counts
    "_lib_seen",  # fingerprints, bucketed sets, the seen set
    "_lib_known",  # the known items of a job that revisits, and their records
    "_lib_live",  # the live items' states
    "_lib_frontier",  # adding items, dispatch
    "_lib_failures",  # leaving flight, failure counts, retry or dead
    "_lib_generation",  # a job's next generation, and its refill
    "_lib_batch",  # a batch of calls as one
)


@functools.cache
def read_lua(name: str) -> str:
    """The text of ``lua/<name>.lua``."""
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


@functools.cache
def library_text() -> str:
    """The library's text: the files of LIBRARY, joined in order."""
    return "\n".join(read_lua(name) for name in LIBRARY)


# The item scripts' run functions are fields of one table, not locals: a Lua chunk has at most
# 200 locals, and the library holds most of that.
_RUNS = "local runs = {}\n"


def _run_function(name: str) -> str:
    """Item script ``name``'s file as the Lua function ``runs.<name>`` of KEYS and ARGV."""
    return f"runs.{name} = function(KEYS, ARGV)\n{read_lua(name)}\nend\n"


def item_script_names() -> tuple[str, ...]:
    """Every item script, the batch forms included."""
    return (*ITEM_SCRIPTS, BATCH)


def _batch_runs() -> str:
    """The Lua expression of BATCH's function: the run function of each of BATCH_SCRIPTS, by
    name, to the library's batch."""
    return "batch({" + ", ".join(f"{n} = runs.{n}" for n in BATCH_SCRIPTS) + "})"


def with_library(text: str) -> str:
    """EVAL text that runs ``text`` as an item script's file: at the top level, after the
    library and its checks, with KEYS and ARGV."""
    return library_text() + "\n" + read_lua("_begin") + "\n" + text


def source(name: str) -> str:
    """The text Redis runs for script ``name`` with EVAL (an item script with the library
    first; BATCH built from the files of BATCH_SCRIPTS)."""
    if name not in item_script_names():
        return read_lua(name)
    if name == BATCH:
        runs = _RUNS + "".join(_run_function(n) for n in BATCH_SCRIPTS)
        return with_library(runs + f"return {_batch_runs()}(KEYS, ARGV)\n")
    return with_library(read_lua(name))


# The functions of the library: begin, each script's run function, and what registers them.
_ENTRIES = """
local function begin(KEYS)
%s
end
local function item_script(run)
  return function(keys, args)
    local err = begin(keys)
    if err then return err end
    return run(keys, args)
  end
end
"""


@dataclass(frozen=True)
class Library:
    """The item scripts as one Redis function library: ``code`` for FUNCTION LOAD, and the
    function that runs each item script (``functions[name]``, for FCALL)."""

    name: str
    code: str
    functions: dict[str, str]


@functools.cache
def library() -> Library:
    """The function library of this version's item scripts."""
    body = (library_text() + _ENTRIES % read_lua("_begin")
            + _RUNS + "".join(_run_function(n) for n in ITEM_SCRIPTS))
    name = "distscrape_" + hashlib.sha1(body.encode()).hexdigest()[:16]
    functions = {n: f"{name}_{n}" for n in item_script_names()}
    registers = "".join(
        f"redis.register_function('{functions[n]}', "
        f"item_script({_batch_runs() if n == BATCH else f'runs.{n}'}))\n"
        for n in item_script_names())
    return Library(name, f"#!lua name={name}\n{body}{registers}", functions)


def register(client: Any, name: str) -> Script:
    """Script ``name`` for ``client``. Nothing is sent to Redis: the script is loaded on its
    first call, and again if Redis lost it."""
    return client.register_script(source(name))


def dispatched(entries: Iterable[Any]) -> list[str]:
    """The items a script handed out for dispatch (the tail of its reply), str or bytes: an item
    to go ahead of the broker's queue comes as a one-item array and becomes :class:`Urgent`."""
    out: list[str] = []
    for entry in entries:
        if isinstance(entry, list):
            item = entry[0]
            out.append(Urgent(item.decode() if isinstance(item, bytes) else item))
        else:
            out.append(entry.decode() if isinstance(entry, bytes) else entry)
    return out
