-- The item scripts' library, part 3 of 8 (scripts.LIBRARY): politeness, by domain. An item's
-- domain, the domain's limits, its turns for dispatch (with head starts from its lease times) and
-- its count of items in flight.

-- -- domains ----------------------------------------------------------------------------------

-- The domain `item` is fetched from: its http(s) URL's host[:port], lower case, user info
-- dropped; or the job's id_domain (its download host) for any other item, an ID shaped 'a://x'
-- too, which is fetched from that host and so must count against its politeness (keys.domain_of
-- is the same rule in Python).
local function domain_of(item)
  local dom = domain_cache[item]
  if dom then return dom end
  dom = old_domain_cache[item]
  if dom then
    room_for_fact()
    domain_cache[item] = dom
    return dom
  end
  local authority = string.match(item, '^[Hh][Tt][Tt][Pp][Ss]?://([^/?#]*)')
  if not authority then
    if not id_domain then id_domain = redis_call('HGET', K_POLICY, 'id_domain') or '-' end
    return id_domain
  end
  dom = string.lower((string.gsub(authority, '^.*@', '')))
  if keep_facts then
    room_for_fact()
    domain_cache[item] = dom
  end
  return dom
end

-- The domain's least microseconds between two fetch starts, and its in-flight cap.
local function limits(dom)
  local l = limits_cache[dom]
  if not l then
    local p = redis_call('HMGET', K_POLICY, 'interval', 'concurrency', 'i:' .. dom, 'c:' .. dom,
      'delay:' .. dom)
    local interval = us(p[3] or p[1] or '0')
    local delay = us(p[5] or '0')
    if delay > interval then interval = delay end
    l = {interval, tonumber(p[4] or p[2] or '') or math.huge}
    limits_cache[dom] = l
  end
  return l[1], l[2]
end

-- How much earlier than its waiting time says a domain without a fetch interval gets its turn:
-- its leases' mean duration, capped. When the task slots are fewer than the domains could use,
-- the slow domains, which decide when a crawl ends, go first; each still keeps to its cap, and
-- no domain waits more than the cap longer than it would without head starts.
local MAX_HEAD_START = 60 * 1000000
local JOB_LATENCY = '/job'

-- The mean lease time of `dom` (microseconds; false if it has none), read once a call with the
-- job's (job_mean) and kept current by record_lease_time (lease_means).
local function lease_mean(dom)
  local mean = lease_means[dom]
  if mean == nil or job_mean == nil then
    local m = redis_call('HMGET', K_LATENCY, dom, JOB_LATENCY)
    if mean == nil then
      mean = tonumber(m[1] or '') or false
      lease_means[dom] = mean
    end
    if job_mean == nil then job_mean = tonumber(m[2] or '') or false end
  end
  return mean
end

local function head_start(dom)
  local h = head_starts[dom]
  if not h then
    h = math.min(lease_mean(dom) or 0, MAX_HEAD_START)
    head_starts[dom] = h
  end
  return h
end

-- A lease of `dom` that began at `since` (Redis time) ended now: fold its duration into the
-- domain's moving mean (a quarter weight to the newest) and into the job's (a 32nd: it follows
-- the mix of domains being fetched, not one page). A batch writes the means once, at its end
-- (write_lease_times).
local function record_lease_time(dom, since)
  local took = redis_now() - since
  if took < 0 then took = 0 end
  local mean = lease_mean(dom)
  local all = job_mean
  all = all and math.floor((31 * all + took) / 32) or took
  if mean then took = math.floor((3 * mean + took) / 4) end
  lease_means[dom], job_mean = took, all
  head_starts[dom] = math.min(took, MAX_HEAD_START)  -- the vacate that follows reads it
  if counts_deferred then
    if not means_unwritten[dom] then
      means_unwritten[dom] = true
      means_unwritten_order[#means_unwritten_order + 1] = dom
    end
  else
    redis_call('HSET', K_LATENCY, dom, int(took), JOB_LATENCY, int(all))
  end
end

-- The means a batch recorded, in one write.
local function write_lease_times()
  if #means_unwritten_order == 0 then return end
  local args = {}
  for _, dom in ipairs(means_unwritten_order) do
    if means_unwritten[dom] then  -- not forgotten since (vacate)
      args[#args + 1] = dom
      args[#args + 1] = int(lease_means[dom])
    end
  end
  args[#args + 1] = JOB_LATENCY
  args[#args + 1] = int(job_mean)
  redis_call('HSET', K_LATENCY, unpack(args))
  means_unwritten, means_unwritten_order = {}, {}
end

-- Whether an item of `dom` (a domain without a fetch interval) goes to the head of the broker's
-- queue: while its message waits there it holds one of the domain's few places under its cap,
-- and the domains with the longest leases are the ones that decide when a crawl ends. The job's
-- mean rises as slow domains take more of the task slots, so they cannot keep all of them.
local function goes_first(dom)
  local h = head_start(dom)
  if job_mean == nil then  -- the domain's head start was known already this call
    job_mean = tonumber(redis_call('HGET', K_LATENCY, JOB_LATENCY) or '') or false
  end
  local all = job_mean or 0
  return all > 0 and h >= 2 * all
end

local function inflight(dom)
  return tonumber(redis_call('HGET', K_INFLIGHT, dom) or '0')
end

-- `dom` has queued items: list it for dispatch if it has room under its cap (`n` in flight, if
-- the caller knows), keeping a turn it already has; a new turn comes when its fetch slot opens,
-- or, without an interval, now less its head start.
local function schedule(dom, n)
  local interval, cap = limits(dom)
  if (n or inflight(dom)) < cap then
    local at = redis_now()
    if interval > 0 then
      local slot = tonumber(redis_call('HGET', K_SLOTS, dom) or '0')
      if slot > at then at = slot end
    else
      at = at - head_start(dom)
    end
    redis_call('ZADD', K_DOMAINS, 'NX', int(at), dom)
  end
end

-- A d or l item of `dom` left flight: that may open room under the domain's cap.
local function vacate(dom)
  local n = redis_call('HINCRBY', K_INFLIGHT, dom, '-1')
  local queued = redis_call('LLEN', K_QUEUES .. dom) > 0
  if n <= 0 then
    redis_call('HDEL', K_INFLIGHT, dom)
    -- An idle domain forgets its lease times: kept for every domain ever fetched, they would
    -- grow with a broad crawl's millions of hosts.
    if not queued then
      redis_call('HDEL', K_LATENCY, dom)
      head_starts[dom], lease_means[dom], means_unwritten[dom] = nil, false, nil
    end
  end
  if queued then schedule(dom, n) end
end

-- An item of `dom` went into flight (dispatched, or leased straight from its queue).
local function occupy(dom)
  local _, cap = limits(dom)
  if redis_call('HINCRBY', K_INFLIGHT, dom, '1') >= cap then redis_call('ZREM', K_DOMAINS, dom) end
end

-- Put `item` (queued now) in its domain's queue: at its head when `front`.
local function enqueue(item, front)
  local dom = domain_of(item)
  if front then
    redis_call('LPUSH', K_QUEUES .. dom, item)
  else
    redis_call('RPUSH', K_QUEUES .. dom, item)
  end
  schedule(dom)
end

