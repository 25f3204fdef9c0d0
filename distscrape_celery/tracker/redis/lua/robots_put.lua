-- Store a robots.txt record and keep the robots.txt cache within its bound (web/robots.py).
-- KEYS: 1 the record, 2 its fetch claim, 3 the index (zset: name -> expiry, ms),
--       4 the sizes (hash: name -> bytes counted), 5 the total of the sizes
-- ARGV: 1 the record's name, 2 the record, 3 its TTL (ms), 4 the bytes it counts as,
--       5 the cache's bound (bytes), 6 the prefix of record keys (a name appended is its key)
-- Returns the bytes the cache counts once it is done.
-- Expired entries go first (at most 100 a call: the rest on later calls, still counted until
-- then), then the soonest to expire, until the total is within the bound. Every key is in the
-- {robots} hash tag, the record keys built here included: one cluster slot.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local name, ttl, size = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4])
local bound = tonumber(ARGV[5])
local total = tonumber(redis.call('GET', KEYS[5]) or '0')
local old = redis.call('HGET', KEYS[4], name)
if old then total = total - tonumber(old) end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
redis.call('DEL', KEYS[2])
redis.call('ZADD', KEYS[3], now + ttl, name)
redis.call('HSET', KEYS[4], name, size)
total = total + size
local expired = 0
while true do
  local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if #first == 0 then break end
  local due = tonumber(first[2]) <= now
  if total <= bound and not (due and expired < 100) then break end
  if due then expired = expired + 1 end
  redis.call('ZREM', KEYS[3], first[1])
  redis.call('DEL', ARGV[6] .. first[1])
  total = total - tonumber(redis.call('HGET', KEYS[4], first[1]) or '0')
  redis.call('HDEL', KEYS[4], first[1])
end
if total < 0 then total = 0 end
redis.call('SET', KEYS[5], total)
return total
