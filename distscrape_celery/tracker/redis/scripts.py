"""The tracker's Lua scripts (``lua/``), read from the package once per process.

An item script is ``_lib.lua`` followed by its own file; the others stand alone. A batch script
(``NAME_many``, for NAME in BATCH_SCRIPTS) runs NAME's own file once per item of a batch, in one
call: built here from that same file, so the protocol has one text.
"""

from __future__ import annotations

import functools
from importlib import resources
from collections.abc import Iterable
from typing import Any

from redis.commands.core import Script

from ..model import Urgent

# The scripts on a job's items: each runs on one shard's keys and raises NOJOB for a missing job.
ITEM_SCRIPTS = (
    "add", "checkout", "scraped", "begin_save", "defer_save", "complete", "fail", "extend",
    "maintain", "release", "retry_dead", "control", "handoff", "unclaimed_saves", "expire_saves",
)
# Item scripts with a batch form, NAME_many: what a save batch calls once for all its pages.
BATCH_SCRIPTS = ("begin_save", "complete")
# The item keys every item script takes (KEYS[1] to KEYS[21], see _lib.lua).
ITEM_KEYS = 21

# NAME_many: the item keys, then each call's one extra key (KEYS[22] of NAME alone), in order.
# ARGV[1]: the calls; ARGV[2]: the arguments of each; then every call's arguments, in order.
# Each call runs NAME's text as a function whose KEYS and ARGV are that call's own (the
# library's key names, read from the batch's KEYS, are the same for every call); the reply is
# the list of their replies. The library's checks (the job exists, its format) run once.
_BATCH = """
local function one(KEYS, ARGV)
%s
end
local calls, width = tonumber(ARGV[1]), tonumber(ARGV[2])
local call_keys, replies = {}, {}
for k = 1, %d do call_keys[k] = KEYS[k] end
for i = 1, calls do
  call_keys[%d] = KEYS[%d + i]
  local args, base = {}, 2 + (i - 1) * width
  for j = 1, width do args[j] = ARGV[base + j] end
  replies[i] = one(call_keys, args)
end
return replies
"""


@functools.cache
def read_lua(name: str) -> str:
    """The text of ``lua/<name>.lua``."""
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


def source(name: str) -> str:
    """The text Redis runs for script ``name`` (an item script with the library first; a
    ``NAME_many`` batch script built from NAME's file)."""
    if name.endswith("_many") and name[:-len("_many")] in BATCH_SCRIPTS:
        body = read_lua(name[:-len("_many")])
        return (read_lua("_lib") + "\n"
                + _BATCH % (body, ITEM_KEYS, ITEM_KEYS + 1, ITEM_KEYS))
    text = read_lua(name)
    if name in ITEM_SCRIPTS:
        text = read_lua("_lib") + "\n" + text
    return text


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
