-- complete: mark an item done after its body was saved. Idempotent, and open to any token: a save
-- that succeeded late, after the item was handed to another worker, still completes it (the
-- savers are idempotent, so the other worker's save leaves one copy).
-- KEYS: the item keys (see _lib.lua)
-- ARGV[1] item
-- ARGV[2] bound, ARGV[3] max_batch, ARGV[4] lease   dispatch top-up, as in add.lua
-- Returns {changed (1 or 0), dispatch_item...}
local item = ARGV[1]
local bound, max_batch, lease = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local changed = 0
local v = redis.call('HGET', K_ITEMS, item)
if v then
  local state, depth = split_state(v)
  if state ~= 'D' and state ~= 'X' then
    if state == 'q' then redis.call('HINCRBY', K_STATS, 'queued', -1) end
    clear_inflight(item, state)
    redis.call('HSET', K_ITEMS, item, 'D' .. depth)
    redis.call('HDEL', K_FAILS, item)
    redis.call('HDEL', K_LOST, item)
    redis.call('HINCRBY', K_STATS, 'done', 1)
    changed = 1
  end
end
local out = {changed}
return take_for_dispatch(bound, max_batch, redis_now() + lease, out)
