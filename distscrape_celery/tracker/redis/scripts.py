"""The tracker's Lua scripts (``lua/``), read from the package once per process.

An item script is ``_lib.lua`` followed by its own file; the others stand alone.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

from redis.commands.core import Script

# The scripts on a job's items: each runs on one shard's keys and raises NOJOB for a missing job.
ITEM_SCRIPTS = (
    "add", "checkout", "scraped", "begin_save", "defer_save", "complete", "fail", "extend",
    "maintain", "release", "retry_dead", "control", "handoff", "unclaimed_saves", "expire_saves",
)


@functools.cache
def read_lua(name: str) -> str:
    """The text of ``lua/<name>.lua``."""
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


def register(client: Any, name: str) -> Script:
    """Script ``name`` for ``client``, with the library first if it is an item script. Nothing
    is sent to Redis: the script is loaded on its first call, and again if Redis lost it."""
    source = read_lua(name)
    if name in ITEM_SCRIPTS:
        source = read_lua("_lib") + "\n" + source
    return client.register_script(source)
