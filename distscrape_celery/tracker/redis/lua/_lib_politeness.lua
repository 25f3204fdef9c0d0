-- The item scripts' library, part 3 of 10 (scripts.LIBRARY): politeness, by domain. An item's
-- domain, the domain's limits, its turns for dispatch (with head starts from its lease times) and
-- its count of items in flight.

-- -- domains ----------------------------------------------------------------------------------

-- The domain `item` is fetched from: its http(s) URL's host[:port], lower case, user info
-- dropped; or the job's id_domain (its download host) for any other item, an ID shaped 'a://x'
-- too, which is fetched from that host and so must count against its politeness (keys.domain_of
-- is the same rule in Python).
local function domain_of(item)
  local domain = domain_cache[item]
  if domain then return domain end
  domain = old_domain_cache[item]
  if domain then
    make_cache_room()
    domain_cache[item] = domain
    return domain
  end
  local authority = string.match(item, '^[Hh][Tt][Tt][Pp][Ss]?://([^/?#]*)')
  if not authority then
    if not id_domain then id_domain = redis_call('HGET', K_POLICY, 'id_domain') or '-' end
    return id_domain
  end
  domain = string.lower((string.gsub(authority, '^.*@', '')))
  if caching_items then
    make_cache_room()
    domain_cache[item] = domain
  end
  return domain
end

-- The domain's least microseconds between two fetch starts, its in-flight cap (the job's own
-- limits for it), and its site: what the budget shared with other jobs is counted by, the domain
-- itself or, with the job's pace 'ip', the address a worker last resolved it to (note_address).
local function limits(domain)
  local cached = limits_cache[domain]
  if not cached then
    local policy = redis_call('HMGET', K_POLICY, 'interval', 'concurrency', 'i:' .. domain,
      'c:' .. domain, 'delay:' .. domain, 'pace', 'a:' .. domain)
    local interval = micros(policy[3] or policy[1] or '0')
    local delay = micros(policy[5] or '0')
    if delay > interval then interval = delay end
    local site = domain
    if policy[6] == 'ip' and policy[7] then site = policy[7] end
    cached = {interval, tonumber(policy[4] or policy[2] or '') or math.huge, site, policy[6]}
    limits_cache[domain] = cached
  end
  return cached[1], cached[2], cached[3]
end

-- How much earlier than its waiting time says a domain without a fetch interval gets its turn:
-- its leases' mean duration, capped. When the task slots are fewer than the domains could use,
-- the slow domains, which decide when a crawl ends, go first; each still keeps to its cap, and
-- no domain waits more than the cap longer than it would without head starts.
local MAX_HEAD_START = 60 * 1000000
local JOB_LATENCY = '/job'

-- The mean lease time of `domain` (microseconds; false if it has none), read once a call with the
-- job's (job_mean) and kept current by record_lease_time (lease_means).
local function lease_mean(domain)
  local mean = lease_means[domain]
  if mean == nil or job_mean == nil then
    local stored = redis_call('HMGET', K_LATENCY, domain, JOB_LATENCY)
    if mean == nil then
      mean = tonumber(stored[1] or '') or false
      lease_means[domain] = mean
    end
    if job_mean == nil then job_mean = tonumber(stored[2] or '') or false end
  end
  return mean
end

local function head_start(domain)
  local head = head_starts[domain]
  if not head then
    head = math.min(lease_mean(domain) or 0, MAX_HEAD_START)
    head_starts[domain] = head
  end
  return head
end

-- A lease of `domain` that began at `since` (Redis time) ended now: fold its duration into the
-- domain's moving mean (a quarter weight to the newest) and into the job's (a 32nd: it follows
-- the mix of domains being fetched, not one page). A batch writes the means once, at its end
-- (write_lease_times).
local function record_lease_time(domain, since)
  local took = redis_now() - since
  if took < 0 then took = 0 end
  local mean = lease_mean(domain)
  local new_job_mean = job_mean
  new_job_mean = new_job_mean and math.floor((31 * new_job_mean + took) / 32) or took
  if mean then took = math.floor((3 * mean + took) / 4) end
  lease_means[domain], job_mean = took, new_job_mean
  head_starts[domain] = math.min(took, MAX_HEAD_START)  -- the vacate that follows reads it
  if counts_deferred then
    if not means_unwritten[domain] then
      means_unwritten[domain] = true
      means_unwritten_order[#means_unwritten_order + 1] = domain
    end
  else
    redis_call('HSET', K_LATENCY, domain, int_text(took), JOB_LATENCY, int_text(new_job_mean))
  end
end

-- The means a batch recorded, in one write.
local function write_lease_times()
  if #means_unwritten_order == 0 then return end
  local args = {}
  for _, domain in ipairs(means_unwritten_order) do
    if means_unwritten[domain] then  -- not forgotten since (vacate)
      args[#args + 1] = domain
      args[#args + 1] = int_text(lease_means[domain])
    end
  end
  args[#args + 1] = JOB_LATENCY
  args[#args + 1] = int_text(job_mean)
  redis_call('HSET', K_LATENCY, unpack(args))
  means_unwritten, means_unwritten_order = {}, {}
end

-- Whether an item of `domain` (a domain without a fetch interval) goes to the head of the broker's
-- queue: while its message waits there it holds one of the domain's few places under its cap,
-- and the domains with the longest leases are the ones that decide when a crawl ends. The job's
-- mean rises as slow domains take more of the task slots, so they cannot keep all of them.
local function goes_first(domain)
  local head = head_start(domain)
  if job_mean == nil then  -- the domain's head start was known already this call
    job_mean = tonumber(redis_call('HGET', K_LATENCY, JOB_LATENCY) or '') or false
  end
  local mean_of_job = job_mean or 0
  return mean_of_job > 0 and head >= 2 * mean_of_job
end

-- -- sites: the budget every job crawling a site shares -----------------------------------------
-- A site's fetches are paced by the strictest limits of the jobs that fetched from it lately
-- (within sites.WINDOW, or twice a job's own interval if longer): its longest interval
-- (max_rate, Crawl-delay) and its smallest in-flight cap. The site's keys (KEYS[14], K_SITES) are
-- shared by every job on one Redis; on a cluster they are the job's own (keys.py), and so is the
-- budget. The cap counts the site's fetches under way (leased items), each job's in a sorted set
-- of its own, and holds a fetch back only while another job has some: alone, a job keeps to its
-- own cap on the items of a domain in flight (messages in the broker included), as ever.
-- One table of functions: the script chunks that the library begins are near Lua's 200 locals.
-- `sites.budgets` caches, by site, what a call read of it (set anew by _begin.lua).
local sites = {WINDOW = 10 * 1000000}

-- A worker resolved `domain`'s host to `address` for the fetch it leases now: with the job's pace
-- 'ip', that address is the domain's site from now on. A fetch under way when the address changes
-- keeps its place under the old one until its lease's deadline.
function sites.note_address(domain, address)
  limits(domain)
  local cached = limits_cache[domain]
  if cached[4] ~= 'ip' or cached[3] == address then return end
  redis_call('HSET', K_POLICY, 'a:' .. domain, address)
  cached[3] = address
end

-- The sorted set of `job`'s fetches under way from `site`: item -> its lease's deadline.
function sites.fetches(job, site)
  return K_SITES .. 'f:' .. job .. ':' .. site
end

-- The site's budget: the strictest interval and cap of the jobs that fetched from it lately, this
-- job's own limits for the domain (`interval`, `cap`) among them, and the other jobs' names; this
-- job's entry is written when it changes or half its time has passed, so a steady crawl writes it
-- a few times a minute.
function sites.budget(site, interval, cap)
  local found = sites.budgets[site]
  if found then return found end
  local key = K_SITES .. 'j:' .. site
  local now = redis_now()
  local entries = redis_call('HGETALL', key)
  found = {interval, cap, {}}
  local own
  for i = 1, #entries, 2 do
    local entry = entries[i + 1]
    local other_interval, other_cap, till = string.match(entry, '^(%d+) (%d+) (%d+)$')
    till = tonumber(till or '0')
    if entries[i] == job_name then
      own = {entry, till}
    elseif till > now then
      other_interval, other_cap = tonumber(other_interval), tonumber(other_cap)
      if other_interval > found[1] then found[1] = other_interval end
      if other_cap > 0 and other_cap < found[2] then found[2] = other_cap end
      found[3][#found[3] + 1] = entries[i]
    else
      redis_call('HDEL', key, entries[i])
    end
  end
  local hold = math.max(2 * interval, sites.WINDOW)
  -- A cap of 0: none.
  local limits_text = int_text(interval) .. ' ' .. (cap == math.huge and '0' or int_text(cap))
  if not own or str_sub(own[1], 1, #limits_text + 1) ~= limits_text .. ' '
      or own[2] - now < hold / 2 then
    redis_call('HSET', key, job_name, limits_text .. ' ' .. int_text(now + hold))
    -- The key lives as long as its longest entry (another job's may outlive this one's).
    if #found[3] == 0 or redis_call('PTTL', key) < hold / 1000 then
      redis_call('PEXPIRE', key, int_text(math.ceil(hold / 1000)))
    end
  end
  sites.budgets[site] = found
  return found
end

-- When the site's next fetch may start (microseconds, Redis time; 0: now).
function sites.slot(site)
  return tonumber(redis_call('GET', K_SITES .. 's:' .. site) or '0')
end

-- When a fetch of `domain` (of job limits `interval` and `cap`) from `site` may start, under the
-- site's budget (0 or a time passed: now). While the site's fetches under way, of every job, are
-- at its cap and some are another job's, its next turn comes a little later: about as long as the
-- domain's fetches take (its mean lease time), from 20 ms to a second. A fetch whose lease ran out
-- (its job deleted meanwhile) does not count.
function sites.opens(domain, site, interval, cap)
  local budget = sites.budget(site, interval, cap)
  local now = redis_now()
  local slot = budget[1] > 0 and sites.slot(site) or 0
  if slot > now or budget[2] == math.huge or #budget[3] == 0 then return slot end
  local under_way = 0
  for _, other in ipairs(budget[3]) do
    under_way = under_way + redis_call('ZCOUNT', sites.fetches(other, site), int_text(now), '+inf')
  end
  if under_way == 0 then return slot end
  under_way = under_way + redis_call('ZCARD', sites.fetches(job_name, site))
  if under_way < budget[2] then return slot end
  return now + math.min(math.max(lease_mean(domain) or 0, 20000), 1000000)
end

-- A fetch of `item` from `site` starts now, under a lease until `deadline`: the site's next fetch
-- waits its interval (the key lives until then), and the fetch is under way until sites.stop
-- (extend keeps its deadline with the lease's).
function sites.start(item, site, deadline)
  local site_interval = sites.budgets[site][1]
  if site_interval > 0 then
    redis_call('SET', K_SITES .. 's:' .. site, int_text(redis_now() + site_interval), 'PX',
      int_text(math.ceil(site_interval / 1000)))
  end
  redis_call('ZADD', sites.fetches(job_name, site), int_text(deadline), item)
end

-- The fetch of `item` of `domain` is over (its lease ended or moved on to saving).
function sites.stop(item, domain)
  local _, _, site = limits(domain)
  redis_call('ZREM', sites.fetches(job_name, site), item)
end

local function inflight(domain)
  return tonumber(redis_call('HGET', K_INFLIGHT, domain) or '0')
end

-- `domain` has queued items: list it for dispatch if it has room under its cap (`in_flight`: its
-- items in flight, if the caller knows), keeping a turn it already has; a new turn comes when its
-- fetch slot opens, or, without an interval, now less its head start.
local function schedule(domain, in_flight)
  local interval, cap = limits(domain)
  if (in_flight or inflight(domain)) < cap then
    local at = redis_now()
    if interval > 0 then
      local _, _, site = limits(domain)
      local slot = sites.slot(site)
      if slot > at then at = slot end
    else
      at = at - head_start(domain)
    end
    redis_call('ZADD', K_DOMAINS, 'NX', int_text(at), domain)
  end
end

-- -- a domain's queue -------------------------------------------------------------------------
-- Items of priority 0 wait in the domain's list, first in first out, as in a job that uses no
-- priorities; the others in its zset (KEYS[2] in _lib_call.lua), by queue_score. Dispatch
-- (pop_queued in _lib_frontier.lua) takes the highest priority first, the list's items counting
-- as priority 0. The zset is looked at only once the job queued such an item (priorities_used),
-- so a job that uses no priorities makes the same commands as ever.

local function priority_queue(domain)
  return K_QUEUES .. domain .. '/p'
end

-- A zset score: the priority first (higher first: lower score), then the order of arrival, one
-- sequence per job (stats field `arrivals`); an item put back at the front of its priority
-- (`front`) goes ahead of every other of it. Exact as doubles: 2001 priorities x 2^42.
local SCORE_SPAN, SCORE_MIDDLE = 4398046511104, 2199023255552  -- 2^42, 2^41
-- Scores below this are of priorities above 0.
local PRIORITY_ZERO = PRIORITY_MAX * SCORE_SPAN

local function queue_score(priority, arrival, front)
  local base = (PRIORITY_MAX - priority) * SCORE_SPAN + SCORE_MIDDLE
  if front then return base - arrival end
  return base + arrival
end

-- `n` new arrival numbers: the last of them (the first is last - n + 1).
local function arrivals(n)
  return redis_call('HINCRBY', K_STATS, 'arrivals', int_text(n))
end

-- The job queued its first item of a priority other than 0: from now on its zsets count.
local function use_priorities()
  if priorities_used then return end
  redis_call('HSET', K_CONTROL, 'priorities', '1')
  priorities_used = true
end

-- Whether `domain` has no queued item (stale entries aside, which are counted).
local function queue_empty(domain)
  if redis_call('LLEN', K_QUEUES .. domain) > 0 then return false end
  return not priorities_used or redis_call('ZCARD', priority_queue(domain)) == 0
end

-- A d or l item of `domain` left flight: that may open room under the domain's cap.
local function vacate(domain)
  local in_flight = redis_call('HINCRBY', K_INFLIGHT, domain, '-1')
  local queued = not queue_empty(domain)
  if in_flight <= 0 then
    redis_call('HDEL', K_INFLIGHT, domain)
    -- An idle domain forgets its lease times: kept for every domain ever fetched, they would
    -- grow with a broad crawl's millions of hosts.
    if not queued then
      redis_call('HDEL', K_LATENCY, domain)
      head_starts[domain], lease_means[domain], means_unwritten[domain] = nil, false, nil
    end
  end
  if queued then schedule(domain, in_flight) end
end

-- An item of `domain` went into flight (dispatched, or leased straight from its queue).
local function occupy(domain)
  local _, cap = limits(domain)
  if redis_call('HINCRBY', K_INFLIGHT, domain, '1') >= cap then
    redis_call('ZREM', K_DOMAINS, domain)
  end
end

-- Put `item` (queued now, at `rank`: its depth and priority) in its domain's queue: at the head
-- of its priority when `front`. vacate lists the domain when `quiet`, else this does.
local function enqueue(item, front, rank, quiet)
  local domain = domain_of(item)
  local priority = priority_of(rank)
  if priority ~= 0 then
    use_priorities()
    redis_call('ZADD', priority_queue(domain), int_text(queue_score(priority, arrivals(1), front)),
      item)
  elseif front then
    redis_call('LPUSH', K_QUEUES .. domain, item)
  else
    redis_call('RPUSH', K_QUEUES .. domain, item)
  end
  if not quiet then schedule(domain) end
end

