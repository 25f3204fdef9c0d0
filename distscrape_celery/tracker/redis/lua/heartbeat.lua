-- heartbeat: record that a worker is alive and report the live workers' total concurrency, which
-- sets how many messages the broker may hold.
-- KEYS[1] heartbeats    zset worker id -> last heartbeat (Redis clock)
-- KEYS[2] concurrency   hash worker id -> concurrency
-- ARGV[1] worker        id of the beating worker, or '' to only read
-- ARGV[2] max_age       seconds after its last heartbeat that a worker counts as dead
-- Returns {total_concurrency, live_workers}
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
if ARGV[1] ~= '' then redis.call('ZADD', KEYS[1], now, ARGV[1]) end
local live = redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[2]), '+inf')
local total = 0
for _, id in ipairs(live) do
  total = total + tonumber(redis.call('HGET', KEYS[2], id) or '0')
end
return {total, #live}
