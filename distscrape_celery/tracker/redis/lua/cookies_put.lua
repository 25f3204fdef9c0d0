-- Store the cookies a response set for one cookie domain in a job's jar (web/cookies.py),
-- keeping the jar within its bounds.
-- KEYS: 1 the jar (hash: cookie domain -> JSON object, "<path> <name>" -> cookie),
--       2 the bytes the jar holds (its fields and values)
-- ARGV: 1 the cookie domain, 2 now (Unix seconds, the worker's clock, as the cookies' expiries),
--       3 the most cookies a domain keeps, 4 the most bytes the jar holds,
--       5 a JSON array of changes: {k = "<path> <name>", c = the cookie, or absent to delete it}
-- Returns 1 if the domain's cookies were stored, 0 if the jar had no room for them (the jar
-- is then left as it was).
-- Each cookie carries "expires" (Unix seconds, or null for a session cookie) and "t" (when it
-- was set, µs): expired ones are dropped here, and past the domain's bound the oldest set go
-- first.
local domain, now = ARGV[1], tonumber(ARGV[2])
local per_domain, bound = tonumber(ARGV[3]), tonumber(ARGV[4])
local old = redis.call('HGET', KEYS[1], domain)
local jar = {}
if old then jar = cjson.decode(old) end
for _, change in ipairs(cjson.decode(ARGV[5])) do
  if change.c then jar[change.k] = change.c else jar[change.k] = nil end
end
local count = 0
for k, cookie in pairs(jar) do
  if type(cookie.expires) == 'number' and cookie.expires <= now then jar[k] = nil else count = count + 1 end
end
while count > per_domain do
  local oldest, first = nil, nil
  for k, cookie in pairs(jar) do
    if first == nil or cookie.t < first then oldest, first = k, cookie.t end
  end
  jar[oldest] = nil
  count = count - 1
end
local total = tonumber(redis.call('GET', KEYS[2]) or '0')
if old then total = total - #old - #domain end
local value = nil
if count > 0 then
  value = cjson.encode(jar)
  total = total + #value + #domain
end
if total > bound then return 0 end
if value then redis.call('HSET', KEYS[1], domain, value) else redis.call('HDEL', KEYS[1], domain) end
if total < 0 then total = 0 end
redis.call('SET', KEYS[2], total)
return 1
