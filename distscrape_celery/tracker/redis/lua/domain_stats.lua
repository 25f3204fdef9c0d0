-- domain_stats: the figures of every domain of one shard of a job that has something queued or
-- in flight, read only (the job API's domain table): the domains with queued items are in
-- `domains` (room under their cap) or `inflight` (at it); `latency` holds the mean of each
-- domain that fetched and still has work. One call, however many domains: 10,000 of them cost
-- Redis a few milliseconds, where a round trip's worth of commands each would cost the client
-- seconds.
-- KEYS[1] domains   zset  domain -> when it may next be dispatched (KEYS[12] in _lib_call.lua)
-- KEYS[2] inflight  hash  domain -> its dispatched and leased items (KEYS[13])
-- KEYS[3] latency   hash  domain -> its leases' moving mean duration, µs, and the job's own
--                         under '/job' (JOB_LATENCY in _lib_politeness.lua; KEYS[21])
-- KEYS[4] queues    the prefix of the domain queues (KEYS[2]): `KEYS[4] .. domain` is a list,
--                   `KEYS[4] .. domain .. '/p'` a zset, the same rule as the item scripts'
-- Returns {domain, queued (its queue's entries), in flight, mean µs or '', ...}, flattened
local JOB_LATENCY = '/job'
local listed, out = {}, {}

local function add(domain)
  if domain == JOB_LATENCY or listed[domain] then return end
  listed[domain] = true
  local queue = KEYS[4] .. domain
  out[#out + 1] = domain
  out[#out + 1] = redis.call('LLEN', queue) + redis.call('ZCARD', queue .. '/p')
  out[#out + 1] = tonumber(redis.call('HGET', KEYS[2], domain) or '0')
  out[#out + 1] = redis.call('HGET', KEYS[3], domain) or ''
end

for _, domain in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do add(domain) end
for _, domain in ipairs(redis.call('HKEYS', KEYS[2])) do add(domain) end
for _, domain in ipairs(redis.call('HKEYS', KEYS[3])) do add(domain) end
return out
