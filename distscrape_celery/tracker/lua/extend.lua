-- extend: push back the deadline of in-flight items a live worker holds (heartbeat, long work).
-- Items that are not in flight any more (done, reclaimed) are left alone.
-- KEYS: the item keys (see _lib.lua)
-- ARGV[1] lease     new deadline = now + lease
-- ARGV[2..] items
-- Returns the number of items extended
local deadline = redis_now() + tonumber(ARGV[1])
local n = 0
for i = 2, #ARGV do
  n = n + redis.call('ZADD', K_LEASED, 'XX', 'CH', deadline, ARGV[i])
  n = n + redis.call('ZADD', K_DISPATCHED, 'XX', 'CH', deadline, ARGV[i])
end
return n
