"""A job's live items as the tracker keeps them, read from its raw keys for tests.

A live item is a fingerprint in a live-item bucket; its name is kept only where its state puts
it (its domain's queue, delayed, dispatched, leased, pending, dead). These helpers read both in
one Lua script (the tracker's own _lib.lua with a few lines after it), so the picture is of one
moment: an item moving between keys between two reads would otherwise look lost or orphaned.
"""

from __future__ import annotations

from typing import Any, Optional

from distscrape_celery.tracker import keys
from distscrape_celery.tracker.redis.scripts import with_library

# KEYS: the item keys (see _lib.lua)
# ARGV[1] mode    'all': every live item; 'one': the state of the items ARGV[2..]
# Returns for 'all': item, value, item, value, ..., '', then the fingerprints of live items that
# no key names (an item the job can no longer hand out: never expected); for 'one': a value or
# false per item. A value is the state letter and depth ('q0'), as _lib.lua's live_get.
_BODY = """
if ARGV[1] == 'one' then
  local out = {}
  for i = 2, #ARGV do out[#out + 1] = live_get(ARGV[i]) or false end
  return out
end
local named, out = {}, {}
local function visit(item)
  local fp = fingerprint(item)
  if named[fp] then return end
  local v = live_get(item)
  if v then
    named[fp] = true
    out[#out + 1] = item
    out[#out + 1] = v
  end
end
local cursor = '0'
repeat
  local r = redis.call('SCAN', cursor, 'MATCH', K_QUEUES .. '*', 'COUNT', 1000)
  cursor = r[1]
  for _, q in ipairs(r[2]) do
    -- A domain's list, or its priority zset (its name ends in '/p', see keys.py).
    local names
    if string.sub(q, -2) == '/p' then names = redis.call('ZRANGE', q, 0, -1)
    else names = redis.call('LRANGE', q, 0, -1) end
    for _, item in ipairs(names) do visit(item) end
  end
until cursor == '0'
for _, z in ipairs({K_DELAYED, K_DISPATCHED, K_LEASED, K_PENDING}) do
  for _, item in ipairs(redis.call('ZRANGE', z, 0, -1)) do visit(item) end
end
for _, item in ipairs(redis.call('HKEYS', K_DEAD)) do visit(item) end
out[#out + 1] = ''
bucket_geometry()
for n = 0, live.span + live.split - 1 do
  for _, fp in ipairs(redis.call('HKEYS', bucket_key(live, n))) do
    if not named[fp] then out[#out + 1] = fp end
  end
end
return out
"""

SOURCE = with_library(_BODY)


def _text(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def _args(job: str, shard: int, *args: Any) -> tuple[Any, ...]:
    # The shard's own active marker and sites: every key in the job's slot (a cluster refuses
    # others).
    item_keys = keys.JobKeys(job, shard).item_keys(local_active=True, shared_sites=False)
    return (SOURCE, len(item_keys), *item_keys, *args)


def live_items_call(pipe: Any, job: str, shard: int = 0) -> None:
    """Queue the read of :func:`live_items` on ``pipe`` (a MULTI pipeline, to read it with other
    keys in one step); :func:`parse_live_items` reads its reply."""
    pipe.eval(*_args(job, shard, "all"))


def parse_live_items(reply: list[Any]) -> dict[str, str]:
    reply = [_text(v) for v in reply]
    end = reply.index("")
    orphans = reply[end + 1:]
    assert not orphans, f"live items that no key names (fingerprints): {orphans}"
    return dict(zip(reply[:end:2], reply[1:end:2]))


def live_items(client: Any, job: str, shard: int = 0) -> dict[str, str]:
    """Every live item of ``job`` (one shard) -> its state letter and depth ('q0'), read at one
    moment. Fails if a live fingerprint has no name anywhere (the job could never hand it out)."""
    return parse_live_items(client.eval(*_args(job, shard, "all")))


def item_states(client: Any, job: str, items: list[str], shard: int = 0) -> list[Optional[str]]:
    """The state letter and depth ('q0') of each of ``items``, None for one not live (done,
    never added), read at one moment."""
    if not items:
        return []
    return [_text(v) or None for v in client.eval(*_args(job, shard, "one", *items))]


def item_state(client: Any, job: str, item: str, shard: int = 0) -> Optional[str]:
    """The state letter and depth ('q0') of ``item``, None if it is not live."""
    return item_states(client, job, [item], shard)[0]


def lease_holders(client: Any, job: str) -> dict[str, str]:
    """Every item of ``job`` that a worker holds (scraping or saving) -> that worker's id."""
    owners = client.hgetall(keys.JobKeys(job).owners)
    return {item: owner.split()[0] for item, owner in owners.items()}
