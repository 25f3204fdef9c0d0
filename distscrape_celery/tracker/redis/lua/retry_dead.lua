-- retry_dead: queue a batch of dead items again, with their fault counters reset; items that are
-- not dead (any more) are left alone. A finished job runs again.
-- KEYS: the item keys (see _lib_call.lua)
-- ARGV[1] bound, ARGV[2] max_batch, ARGV[3] lease   dispatch top-up, as in add.lua
-- ARGV[4..] items (the caller sends at most one batch)
-- Returns {requeued, dispatch_item...}
local bound, max_batch, lease = ARGV[1], tonumber(ARGV[2]), micros(ARGV[3])
local requeued = 0
for i = 4, #ARGV do
  local item = ARGV[i]
  local v = live_get(item)
  if v and str_sub(v, 1, 1) == 'X' then
    redis_call('HDEL', K_DEAD, item)
    forget_failures(item)
    count('dead', -1)
    requeue(item, 'X', str_sub(v, 2), false)
    requeued = requeued + 1
  end
end
if requeued > 0 then reactivate() end
local out = {requeued}
return take_for_dispatch(bound, max_batch, redis_now() + lease, out)
