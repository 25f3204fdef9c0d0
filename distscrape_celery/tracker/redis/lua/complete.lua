-- complete: mark an item done after its body was saved. Idempotent, and open to any token: a save
-- that succeeded late, after the item was handed to another worker, still completes it (the
-- savers are idempotent, so the other worker's save leaves one copy).
-- KEYS: the item keys (see _lib_call.lua), then
-- KEYS[22] body   optional: the body staged for this save, dropped here (whatever the item's
--                 state: the save is over) to spare the saver a round trip
-- ARGV[1] item
-- ARGV[2] bound, ARGV[3] max_batch, ARGV[4] lease   dispatch top-up, as in add.lua
-- Returns {changed (1 or 0), dispatch_item...}
local item = ARGV[1]
local bound, max_batch, lease = ARGV[2], tonumber(ARGV[3]), micros(ARGV[4])
local changed = 0
if KEYS[22] then redis_call('UNLINK', KEYS[22]) end
local v = live_get(item)
if v then
  local state = split_state(v)
  if state ~= 'X' then
    finish(item, state)
    changed = 1
  end
end
local out = {changed}
return take_for_dispatch(bound, max_batch, redis_now() + lease, out)
