-- deregister: a worker stopped cleanly. It counts as dead at once, and its records are pruned
-- like any dead worker's (its heartbeat is moved back by max_age).
-- KEYS[1] heartbeats    zset worker id -> last heartbeat
-- ARGV[1] worker, ARGV[2] max_age (seconds after its last heartbeat that a worker counts as dead)
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], 'XX', now - tonumber(ARGV[2]) - 0.001, ARGV[1])
return 1
