-- maintain: reclaim expired leases and dispatches, then top up dispatch. Any live worker runs it
-- on its heartbeat, so recovery needs no singleton process.
-- An expired lease counts as a failed attempt (its worker died or hung on it), so an item that
-- kills every worker that takes it ends dead instead of looping; an expired dispatch (the message
-- was lost, or its worker died before starting it) does not count.
-- KEYS: the item keys (see _lib.lua)
-- ARGV[1] bound, ARGV[2] max_batch, ARGV[3] lease   dispatch top-up, as in add.lua
-- ARGV[4] max_reclaim   most items reclaimed per in-flight set per call
-- ARGV[5] max_retries   as in fail.lua
-- Returns {reclaimed, dead, dispatch_item...}
local bound, max_batch, lease = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local max_reclaim, max_retries = tonumber(ARGV[4]), tonumber(ARGV[5])
local now = redis_now()
local reclaimed, died = 0, 0

local function requeue(item, depth)
  redis.call('HSET', K_ITEMS, item, 'q' .. depth)
  -- To the head: it has waited a whole lease already.
  redis.call('LPUSH', K_FRONTIER, item)
  reclaimed = reclaimed + 1
end

for _, item in ipairs(redis.call('ZRANGEBYSCORE', K_LEASED, '-inf', now, 'LIMIT', 0, max_reclaim)) do
  local owner = redis.call('HGET', K_OWNERS, item) or '?'
  clear_inflight(item)
  local v = redis.call('HGET', K_ITEMS, item)
  if v then
    local state, depth = split_state(v)
    if state == 'l' then
      if redis.call('HINCRBY', K_FAILS, item, 1) <= max_retries then
        requeue(item, depth)
      else
        redis.call('HSET', K_ITEMS, item, 'X' .. depth)
        redis.call('HSET', K_DEAD, item, 'lease expired too often (last holder ' .. owner .. ' died or hung)')
        redis.call('HINCRBY', K_STATS, 'dead', 1)
        died = died + 1
      end
    end
  end
end
for _, item in ipairs(redis.call('ZRANGEBYSCORE', K_DISPATCHED, '-inf', now, 'LIMIT', 0, max_reclaim)) do
  clear_inflight(item)
  local v = redis.call('HGET', K_ITEMS, item)
  if v then
    local state, depth = split_state(v)
    if state == 'd' then requeue(item, depth) end
  end
end
if reclaimed > 0 then redis.call('HINCRBY', K_STATS, 'queued', reclaimed) end
local out = {reclaimed, died}
return take_for_dispatch(bound, max_batch, now + lease, out)
