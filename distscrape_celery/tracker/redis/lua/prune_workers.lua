-- prune_workers: forget workers whose last heartbeat is older than max_age (Redis clock).
-- KEYS[1] heartbeats    zset worker id -> last heartbeat
-- KEYS[2] info          hash worker id -> JSON description
-- KEYS[3] concurrency   hash worker id -> concurrency
-- ARGV[1] max_age       seconds
-- ARGV[2] max           most workers pruned per call
-- Returns the pruned worker ids
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]), 'LIMIT', 0,
  tonumber(ARGV[2]))
for _, id in ipairs(old) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
end
return old
