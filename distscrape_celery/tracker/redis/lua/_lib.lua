-- Shared by every item script: a script runs this text, then _begin.lua, then its own file, with
-- the call's KEYS and ARGV (scripts.py). The item scripts all take the same KEYS:
--   KEYS[1]  items       the prefix of the live-item buckets: `KEYS[1] .. n` is a hash of the live
--                        items' fingerprints -> state and depth (see "live items" below;
--                        JobKeys.item_bucket in keys.py). The states are the letters of
--                        ItemState in tracker/model.py, which says what each means (a unit test
--                        checks CODE and LETTER below against it):
--                              q queued      w delayed       d dispatched    l leased
--                              s save pending                S saving        X dead
--                              A done item (D) is removed (item_value reports it as 'D0' from the
--                              seen set: done items cost only their fingerprint). A live item's
--                              name is kept only where its state puts it: its domain's queue (q),
--                              delayed (w), dispatched (d), leased (l, S), pending (s), dead (X)
--   KEYS[2]  queues      the prefix of the per-domain queue lists: `KEYS[2] .. domain` is a list
--                        of the domain's queued items (entries whose state moved on are skipped
--                        when popped); the same rule as JobKeys.domain_queue in keys.py
--   KEYS[3]  dispatched  zset  d items -> deadline
--   KEYS[4]  leased      zset  l and S items -> deadline: a worker is working on them
--   KEYS[5]  owners      hash  l, s and S items -> "<worker id> <fencing token>"
--   KEYS[6]  stats       hash  counters: seen (items added), queued (q items), done, dead; tokens
--                              (last token); fn, fl and fs, the seen set's size, level and split
--                              pointer (see "the seen set" below); il and is, the live-item
--                              buckets' level and split pointer (their size is seen - done)
--   KEYS[7]  fails       hash  item -> failed attempts that were the item's fault
--   KEYS[8]  dead        hash  item -> why it was given up on
--   KEYS[9]  pending     zset  s items -> deadline (long: the save message may wait in the broker)
--   KEYS[10] lost        hash  item -> times the worker holding it vanished
--   KEYS[11] spec        string the job's spec: an item operation on a job without one is an error
--   KEYS[12] domains     zset  domain -> when it may next be dispatched; exactly the domains whose
--                              queue is not empty and whose in-flight count is under their cap
--   KEYS[13] inflight    hash  domain -> its d and l items (messages and fetches under way)
--   KEYS[14] slots       hash  domain -> when its next fetch may start (domains with an interval)
--   KEYS[15] dseen       hash  domain -> items added (kept only with max_pages_per_domain)
--   KEYS[16] delayed     zset  w items -> when their backoff ends
--   KEYS[17] policy      hash  the job's crawl limits, written once by create_job: interval and
--                              concurrency (every domain's), i:<domain> and c:<domain> (one
--                              domain's), delay:<domain> (its robots.txt Crawl-delay), max_pages,
--                              max_pages_per_domain, id_domain (the domain of items that are not
--                              http(s) URLs); a missing field is no limit
--   KEYS[18] control     hash  the job's state (running, paused, cancelled, finished; missing:
--                              running), job (its name), started, ended, final_seen, final_done,
--                              final_dead (figures recorded when it ended), epoch (ends so far),
--                              format (the job's key layout: the scripts refuse any but 4,
--                              keys.JOB_FORMAT, so a job of an older layout is not mixed up),
--                              created (an ID of this creation of the job, see create_job.lua)
--   KEYS[19] active      set   names of the jobs workers maintain (neither finished nor cancelled):
--                              ds:active-jobs, or the shard's own marker (sharded jobs, Redis
--                              Cluster), which the client mirrors into ds:active-jobs
--   KEYS[20] seen        the prefix of the seen-set buckets: `KEYS[20] .. n` is a set of the
--                        fingerprints of done items (JobKeys.seen_bucket in keys.py)
--   KEYS[21] latency     hash  domain -> how long its leases last from checkout to scraped, a
--                              moving mean in microseconds (its head start, see schedule);
--                              field '/job': the same over all the job's domains (no domain
--                              holds a '/')
-- Every deadline is on Redis's clock (TIME), never a worker's, in whole microseconds: Redis
-- parses, stores and compares an integer score several times faster than a fractional one (a
-- small sorted set keeps its scores as text and reads each back with strtod on every search).
-- Callers pass durations in seconds; us() converts them. Lua's doubles hold these integers
-- exactly (2^53 microseconds is some 285 years).

-- Redis's command call and the functions the scripts use most, as locals: a global is a table
-- lookup at every use (redis.call two), and a page's calls make hundreds. A function library
-- cannot read globals while it loads, so _begin.lua sets these at the start of every call.
local redis_call, str_format, str_sub

-- A script's state lives in the locals below, which _begin.lua sets at the start of every call.
-- In a Redis function library (Redis 7 and later, see scripts.py) this text runs once, when the
-- library is loaded, and its locals outlive the call: nothing a call cached about its job may be
-- read by the next one, so every such cache is declared here and set anew there. The few caches
-- kept from call to call (items' fingerprints and domains, numbers' texts) hold what depends on
-- their key alone.
local K_ITEMS, K_QUEUES, K_DISPATCHED, K_LEASED
local K_OWNERS, K_STATS, K_FAILS, K_DEAD
local K_PENDING, K_LOST, K_SPEC
local K_DOMAINS, K_INFLIGHT, K_SLOTS, K_DSEEN
local K_DELAYED, K_POLICY, K_CONTROL, K_ACTIVE
local K_SEEN, K_LATENCY
-- The job's state, read with its format once a call (every call's dispatch top-up asks for it):
-- set_job_state keeps it current when the call changes it.
local job_state_now
-- Which creation of the job this is (create_job.lua): checkout and begin_save hand it to the
-- worker, whose components built from an earlier job of the same name must not be used.
local job_created
-- The call's caches (begin).
local now_cache, id_domain, limits_cache, head_starts
-- The fingerprints and domains of the items in flight: unlike the caches above they outlive the
-- call in a function library, since each is a function of the item's name alone (a URL's domain; an
-- item that is not an http(s) URL takes its job's id_domain, which is not kept here). An item's
-- five steps are five calls, and each would compute them again (a SHA-1, a pattern match). They are
-- kept in two generations of FACTS_MAX facts: a full generation becomes the old one, the old one is
-- dropped, and a fact found in the old one moves to the new. That bounds the memory they take in
-- Redis's Lua and its collector's work, which sweeps every live object at each of its cycles: kept
-- by the ten thousand, they cost more than they saved. The items that add_items adds are not kept
-- (most are a page's links, found once and queued far longer than a generation lasts).
local FACTS_MAX = 2048
local fp_of, fp_high_of, domain_cache, facts = {}, {}, {}, 0
local old_fp_of, old_fp_high_of, old_domain_cache = {}, {}, {}
-- False while add_items looks at the items it is given.
local keep_facts = true

-- Room for one more fact (fingerprint or domain) of an item.
local function room_for_fact()
  if facts >= FACTS_MAX then
    old_fp_of, old_fp_high_of, old_domain_cache = fp_of, fp_high_of, domain_cache
    fp_of, fp_high_of, domain_cache, facts = {}, {}, {}, 0
  end
  facts = facts + 1
end
-- Lease times (lease_mean): by domain, and the job's; the domains whose mean a batch changed
-- and has yet to write, as a set and in order.
local lease_means, job_mean, means_unwritten, means_unwritten_order
local seen, live, seen_count, STATE_SET
-- Set while a batch runs its calls: the batch tops up dispatch once, at its end, with the last
-- top-up any call asked for (deferred_topup: bound, max_batch, deadline).
local topup_deferred, deferred_topup
-- Set while a batch runs its calls too: the job's counters (stats) are added up in `deltas`, and
-- its fencing tokens handed out from `token_base` on (`tokens_taken` of them), and both are
-- written once, at the batch's end (count, new_token, flush_counts). `grow_deferred`: the live
-- items grew, and their buckets are split then.
local counts_deferred, deltas, token_base, tokens_taken, grow_deferred
-- The job's page limits (add_items), read once a call; whether the call listed the job as
-- active already (reactivate).
local page_limits, reactivated
-- The job's name (control's field job).
local job_name

-- Redis's clock in whole microseconds.
local function redis_now()
  if not now_cache then
    local t = redis_call('TIME')
    now_cache = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now_cache
end

-- An integral number as the text of a command's argument. Redis writes a number it is given with
-- "%.17g", whose arithmetic on every deadline and count cost more than the command; constants
-- are written as text ('1') for the same reason.
-- Small numbers' texts outlive the call (a function of the number alone, and few: depths, packed
-- states, counts); the others are kept for the call, where a batch writes one deadline for many
-- items.
local SMALL_TEXTS = 4096
local small_texts, texts = {}, nil
local function int(n)
  local t = small_texts[n] or texts[n]
  if t then return t end
  t = str_format('%d', n)
  if n >= 0 and n < SMALL_TEXTS then small_texts[n] = t else texts[n] = t end
  return t
end

-- `seconds` (a number or its text) in whole microseconds.
local function us(seconds)
  return math.floor(tonumber(seconds) * 1000000 + 0.5)
end

local function split_state(v)
  return str_sub(v, 1, 1), str_sub(v, 2)
end

-- The holder of an l, s or S item: worker id and fencing token (nil, nil if none).
local function holder(item)
  local o = redis_call('HGET', K_OWNERS, item)
  if not o then return nil, nil end
  local sp = string.find(o, ' ', 1, true)
  return str_sub(o, 1, sp - 1), str_sub(o, sp + 1)
end

-- -- the job's counters ------------------------------------------------------------------------
-- The counters in stats that calls add to; a batch writes them in this order.
local COUNTERS = {'seen', 'queued', 'done', 'dead', 'fn', 'links_cut'}

-- Add `n` (a number) to the job's counter `field`.
local function count(field, n)
  if counts_deferred then
    deltas[field] = (deltas[field] or 0) + n
  else
    redis_call('HINCRBY', K_STATS, field, int(n))
  end
end

-- The job's counters `...` as numbers, what this batch added so far included.
local function counters(...)
  local fields = {...}
  local v = redis_call('HMGET', K_STATS, unpack(fields))
  for i, f in ipairs(fields) do v[i] = tonumber(v[i] or '0') + (deltas[f] or 0) end
  return v
end

-- A new fencing token: above every token handed out before.
local function new_token()
  if not counts_deferred then return redis_call('HINCRBY', K_STATS, 'tokens', '1') end
  if not token_base then token_base = tonumber(redis_call('HGET', K_STATS, 'tokens') or '0') end
  tokens_taken = tokens_taken + 1
  return token_base + tokens_taken
end

-- Write what a batch added to the counters and the tokens it handed out.
local function write_counts()
  for _, field in ipairs(COUNTERS) do
    local n = deltas[field]
    if n and n ~= 0 then redis_call('HINCRBY', K_STATS, field, int(n)) end
  end
  if tokens_taken > 0 then redis_call('HINCRBY', K_STATS, 'tokens', int(tokens_taken)) end
  deltas, token_base, tokens_taken = {}, nil, 0
end

-- -- job state --------------------------------------------------------------------------------

local function job_state()
  return job_state_now
end

-- Every write of the job's state goes through here (or record_end), so job_state stays true.
local function set_job_state(state)
  redis_call('HSET', K_CONTROL, 'state', state)
  job_state_now = state
end

-- A paused or cancelled job hands out nothing; what is in flight goes on.
local function dispatch_held()
  local s = job_state()
  return s == 'paused' or s == 'cancelled'
end

-- The job ends as `state` (finished or cancelled): its end time and figures are recorded, and
-- workers stop maintaining it. The epoch counts these ends: a sharded job is finished when two
-- reads of every shard's state and epoch agree (redis_tracker.py), so no shard finished again in
-- between unseen.
local function record_end(state)
  local c = counters('seen', 'done', 'dead')
  local ended = str_format('%.6f', redis_now() / 1000000)
  redis_call('HSET', K_CONTROL, 'state', state, 'ended', ended,
    'final_seen', int(c[1]), 'final_done', int(c[2]), 'final_dead', int(c[3]))
  job_state_now = state
  redis_call('HINCRBY', K_CONTROL, 'epoch', '1')
  if job_name then redis_call('SREM', K_ACTIVE, job_name) end
  reactivated = false
end

-- New work arrived (items added, dead ones queued again): a finished job runs again, and one
-- that is not cancelled is maintained again.
local function reactivate()
  if reactivated then return end
  local s = job_state()
  if s == 'finished' then
    set_job_state('running')
    redis_call('HDEL', K_CONTROL, 'ended')
  end
  if s ~= 'cancelled' and job_name then redis_call('SADD', K_ACTIVE, job_name) end
  reactivated = true
end

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

-- -- fingerprints -----------------------------------------------------------------------------
-- Every item the job holds is known by its fingerprint: 63 bits of the SHA-1 of the item, written
-- as a decimal integer, so that Redis stores it as a 64-bit integer (in an intset or a listpack)
-- rather than as text. A live item is a field of a live-item bucket; a done item a member of a
-- seen-set bucket. Two items with one fingerprint are one item to the job: the second is never
-- fetched (about n / 8.6e18 for each new item when n are known).
local TWO_33 = 8589934592

-- The fingerprint of `item` (a decimal string: a * 10^9 + b, a < 2^33, b < 10^9, so it fits an
-- int64) and its high part a. Lua numbers are doubles (exact to 2^53), so the two parts are kept
-- apart and joined as text; no leading zero.
local function fingerprint(item)
  local fp = fp_of[item]
  if fp then return fp, fp_high_of[item] end
  fp = old_fp_of[item]
  if fp then
    local a = old_fp_high_of[item]
    room_for_fact()
    fp_of[item], fp_high_of[item] = fp, a
    return fp, a
  end
  local h = redis.sha1hex(item)
  local a = tonumber(str_sub(h, 1, 9), 16) % TWO_33
  local b = tonumber(str_sub(h, 10, 17), 16) % 1000000000
  -- %d (a C long, 64 bits here) is exact for a < 2^33 and cheaper than %.0f.
  if a == 0 then fp = str_format('%d', b) else fp = str_format('%d%09d', a, b) end
  if keep_facts then
    room_for_fact()
    fp_of[item], fp_high_of[item] = fp, a
  end
  return fp, a
end

-- The high part a of a stored fingerprint (all but its last 9 digits).
local function fingerprint_high(member)
  if #member <= 9 then return 0 end
  return tonumber(str_sub(member, 1, #member - 9))
end

-- Buckets grow with their set by linear hashing, so a small job has a few keys and every bucket
-- stays small enough for Redis's compact encodings: the buckets are 0 .. 2^level + split - 1; a
-- fingerprint whose high part is a goes to a mod 2^level, or to a mod 2^(level+1) if that is
-- below the split pointer. When the set holds more than `fill` per bucket, bucket `split` is
-- split in two (its members with bit `level` of a set move to bucket split + 2^level). A bucket
-- not yet split in a round reaches about 2 * fill. A table describes one bucketed set.
local function bucketed(prefix, level_field, split_field)
  return {prefix = prefix, lf = level_field, sf = split_field, keys = {}}
end

local function set_geometry(set, level, split)
  set.level, set.split, set.span = level, split, 2 ^ level
end

local function bucket_key(set, n)
  local k = set.keys[n]
  if not k then
    k = set.prefix .. str_format('%.0f', n)
    set.keys[n] = k
  end
  return k
end

local function bucket_of(set, a)
  local n = a % set.span
  if n < set.split then n = a % (2 * set.span) end
  return bucket_key(set, n)
end

-- Split bucket set.split in two: `rehash(from, to, moves)` moves to the new bucket `to` the
-- members of `from` for which moves(member) is true (those whose a has bit set.level set).
local function split_bucket(set, rehash)
  local span, split = set.span, set.split
  rehash(bucket_key(set, split), bucket_key(set, split + span), function(m)
    return fingerprint_high(m) % (2 * span) ~= split
  end)
  local level = set.level
  split = split + 1
  if split == span then level, split = level + 1, 0 end
  set_geometry(set, level, split)
  redis_call('HSET', K_STATS, set.lf, level, set.sf, split)
end

-- Call `command` on `key` with the values of `list` (flat) a slice at a time, so unpack stays far
-- from Lua's stack limit however long the list is; `step` values a slice (even for pairs).
local function in_slices(command, key, list, step)
  for i = 1, #list, step do
    redis_call(command, key, unpack(list, i, math.min(i + step - 1, #list)))
  end
end

-- -- the seen set ----------------------------------------------------------------------------
-- Done items, by fingerprint only: each bucket is a set that Redis keeps as an intset (8 bytes a
-- member, while a bucket holds at most set-max-intset-entries, 512 by default). A fingerprint is
-- written when its item is done. Level and split pointer: stats fl and fs; size: fn.
local SEEN_FILL = 160

-- The geometry of both bucketed sets and the seen set's size, read in one HMGET once a call
-- (an item is looked up in both, or finished from one to the other).
local function bucket_geometry()
  if not seen_count then
    local g = redis_call('HMGET', K_STATS, 'fl', 'fs', 'fn', 'il', 'is')
    set_geometry(seen, tonumber(g[1] or '0'), tonumber(g[2] or '0'))
    seen_count = tonumber(g[3] or '0')
    set_geometry(live, tonumber(g[4] or '0'), tonumber(g[5] or '0'))
  end
end

local function seen_rehash(from, to, moves)
  local moving = {}
  for _, m in ipairs(redis_call('SMEMBERS', from)) do
    if moves(m) then moving[#moving + 1] = m end
  end
  in_slices('SREM', from, moving, 256)
  in_slices('SADD', to, moving, 256)
end

-- Record done `item` in the seen set (it has just left the live items).
local function remember_done(item)
  bucket_geometry()
  local fp, a = fingerprint(item)
  if redis_call('SADD', bucket_of(seen, a), fp) == 0 then return end  -- a twin's fingerprint
  seen_count = seen_count + 1
  count('fn', 1)
  -- a has 33 bits: past 2^33 buckets (far beyond any job) the buckets just fill up.
  if seen_count > SEEN_FILL * (seen.span + seen.split) and seen.level < 33 then
    split_bucket(seen, seen_rehash)
  end
end

-- Whether `item`, not live, is done (or a done item's fingerprint twin).
local function is_done(item)
  bucket_geometry()
  if seen_count == 0 then return false end
  local fp, a = fingerprint(item)
  return redis_call('SISMEMBER', bucket_of(seen, a), fp) == 1
end

-- -- live items -------------------------------------------------------------------------------
-- Every item added and not done, by fingerprint: each bucket is a hash fingerprint -> state and
-- depth packed in one integer, depth * 8 + the state's code, which Redis keeps as a listpack
-- (about 12 bytes a field: the fingerprint as an int64, the value as a small integer) while a
-- bucket holds at most hash-max-listpack-entries fields (128 by default). LIVE_FILL keeps a
-- bucket not yet split in a round near 2 * 36 = 72, far from 128 at any size. The item's name is
-- kept where its state puts it (KEYS[1] above), so a queued item's name is stored once, in its
-- domain's queue. Level and split pointer: stats il and is; size: seen - done.
local LIVE_FILL = 36
-- The states' letters and codes: ItemState and ItemState.code in tracker/model.py.
local CODE = {q = 0, w = 1, d = 2, l = 3, s = 4, S = 5, X = 6}
local LETTER = {[0] = 'q', 'w', 'd', 'l', 's', 'S', 'X'}

-- The packed value of `state` (a letter) at `depth` (a decimal string or a number).
local function pack(state, depth)
  return int(tonumber(depth) * 8 + CODE[state])
end

-- `item`'s bucket key and fingerprint.
local function live_slot(item)
  bucket_geometry()
  local fp, a = fingerprint(item)
  return bucket_of(live, a), fp
end

-- A packed value's state letter and depth as one string ('q0'), by the value's text: kept across
-- calls (a function of the text alone), up to SMALL_TEXTS of them.
local state_texts, state_text_count = {}, 0

-- The state letter and depth of live `item`, as one string ('q0'); nil if it is not live.
local function live_get(item)
  local key, fp = live_slot(item)
  local v = redis_call('HGET', key, fp)
  if not v then return nil end
  local text = state_texts[v]
  if text then return text end
  local n = tonumber(v)
  local code = n % 8
  text = LETTER[code] .. int((n - code) / 8)
  if state_text_count >= SMALL_TEXTS then state_texts, state_text_count = {}, 0 end
  state_texts[v], state_text_count = text, state_text_count + 1
  return text
end

-- Live `item` (already live: add_items makes items live) is now in `state` at `depth`.
local function live_set(item, state, depth)
  local key, fp = live_slot(item)
  redis_call('HSET', key, fp, pack(state, depth))
end

-- `item` is no longer live (it is done).
local function live_del(item)
  local key, fp = live_slot(item)
  redis_call('HDEL', key, fp)
end

-- A small listpack is cheaper to write anew than to delete half its fields from one by one (each
-- HDEL searches it): the bucket is read whole, dropped, and both halves written.
local function live_rehash(from, to, moves)
  local keep, moving = {}, {}
  local all = redis_call('HGETALL', from)
  for i = 1, #all, 2 do
    local half = keep
    if moves(all[i]) then half = moving end
    half[#half + 1] = all[i]
    half[#half + 1] = all[i + 1]
  end
  redis_call('DEL', from)
  in_slices('HSET', from, keep, 256)
  in_slices('HSET', to, moving, 256)
end

-- The live items grew: split buckets until they hold at most LIVE_FILL each on average (in a
-- batch, once, at its end).
local function grow_live()
  if counts_deferred then
    grow_deferred = true
    return
  end
  bucket_geometry()
  local c = counters('seen', 'done')
  local n = c[1] - c[2]
  while n > LIVE_FILL * (live.span + live.split) and live.level < 33 do
    split_bucket(live, live_rehash)
  end
end

-- The state of `item`: its state letter and depth if live, 'D0' if done (in the seen set only:
-- its depth is forgotten), nil if never added (or taken for a fingerprint collision's twin).
local function item_value(item)
  local v = live_get(item)
  if v then return v end
  if is_done(item) then return 'D0' end
  return nil
end

-- Queue the new items among args[first..] (a script's ARGV) at `depth`, deduplicated, within the
-- job's max_pages and max_pages_per_domain (an item over a limit is dropped, not remembered).
-- Returns how many.
local function add_items(args, first, depth)
  if not page_limits then
    local p = redis_call('HMGET', K_POLICY, 'max_pages', 'max_pages_per_domain')
    page_limits = {tonumber(p[1] or ''), tonumber(p[2] or '')}
  end
  local max_pages, per_domain = page_limits[1], page_limits[2]
  local room = math.huge
  if max_pages then room = max_pages - counters('seen')[1] end
  -- The new items' names are written a slice at a time (one RPUSH per domain).
  local added, new_of, doms = 0, {}, {}
  local value = pack('q', depth)
  keep_facts = false
  for i = first, #args do
    if added >= room then break end
    local item = args[i]
    local dom = domain_of(item)
    if not per_domain or tonumber(redis_call('HGET', K_DSEEN, dom) or '0') < per_domain then
      -- New: not done, and not live (HSETNX makes it live unless it is, earlier in this batch
      -- too). A listpack bucket is searched field by field: one search, not two.
      local key, fp = live_slot(item)
      if not is_done(item) and redis_call('HSETNX', key, fp, value) == 1 then
        if per_domain then redis_call('HINCRBY', K_DSEEN, dom, '1') end
        local q = new_of[dom]
        if not q then
          q = {}
          new_of[dom] = q
          doms[#doms + 1] = dom
        end
        q[#q + 1] = item
        added = added + 1
      end
    end
  end
  keep_facts = true
  if added == 0 then return 0 end
  for _, dom in ipairs(doms) do
    local q = new_of[dom]
    for i = 1, #q, 256 do  -- slices keep unpack far from Lua's stack limit
      redis_call('RPUSH', K_QUEUES .. dom, unpack(q, i, math.min(i + 255, #q)))
    end
    schedule(dom)
  end
  count('seen', added)
  count('queued', added)
  grow_live()
  reactivate()
  return added
end

-- The next queued item of `dom` and its depth, stale entries dropped; nil if none.
local function pop_queued(dom)
  while true do
    local item = redis_call('LPOP', K_QUEUES .. dom)
    if not item then return nil end
    local v = live_get(item)
    if v and str_sub(v, 1, 1) == 'q' then return item, str_sub(v, 2) end
  end
end

-- Backed-off items whose time came go to the back of their domain's queue.
local function promote_due(max_batch)
  local due = redis_call('ZRANGEBYSCORE', K_DELAYED, '-inf', int(redis_now()), 'LIMIT', '0',
    int(max_batch))
  for _, item in ipairs(due) do
    redis_call('ZREM', K_DELAYED, item)
    local v = live_get(item)
    if v and str_sub(v, 1, 1) == 'w' then
      live_set(item, 'q', str_sub(v, 2))
      count('queued', 1)
      enqueue(item, false)
    end
  end
end

-- How many more scrape messages the broker may take under `bound`, the text
-- '<scrape messages> <save pages>' that callers pass: the most scrape messages, and the most
-- pages of save messages (and of saves kept for a batch), of this job (of this shard) the broker
-- may hold. Saves waiting over their bound hold dispatch back too, so slow saving slows the
-- scraping rather than filling the broker.
local function dispatch_room(bound)
  local scrapes, saves = string.match(bound, '^(%d+) (%d+)$')
  if not scrapes then error('bad dispatch bound: ' .. bound) end
  local room = tonumber(scrapes) - redis_call('ZCARD', K_DISPATCHED)
  local save_room = tonumber(saves) - redis_call('ZCARD', K_PENDING)
  if save_room < room then room = save_room end
  return room
end

-- Move queued items to `dispatched` while dispatch_room(bound) allows (at most `max_batch` per
-- call), and return them; the caller publishes one scrape task for each, ahead of the broker's
-- queue for an item returned as a one-item table (goes_first). Domains take turns,
-- those waiting longest first (with their head starts), one item per turn; a domain with an
-- interval gets one turn per interval, and none at its in-flight cap.
local function take_for_dispatch(bound, max_batch, deadline, out)
  if topup_deferred then
    deferred_topup = {bound, max_batch, deadline}
    return out
  end
  promote_due(max_batch)
  if dispatch_held() then return out end
  local room = dispatch_room(bound)
  if room > max_batch then room = max_batch end
  if room <= 0 then return out end
  local now = redis_now()
  local taken = 0
  -- Each round serves every ready domain once (or drops it, its queue empty), so it ends. A
  -- round that found fewer domains than it asked for found them all: another is needed only if
  -- one of them got its next turn at once.
  while room > 0 do
    local asked, again = room, false
    local doms = redis_call('ZRANGEBYSCORE', K_DOMAINS, '-inf', int(now), 'LIMIT', '0', int(room))
    if #doms == 0 then break end
    for _, dom in ipairs(doms) do
      if room == 0 then break end
      local item, depth = pop_queued(dom)
      if not item then
        redis_call('ZREM', K_DOMAINS, dom)
      else
        live_set(item, 'd', depth)
        redis_call('ZADD', K_DISPATCHED, int(deadline), item)
        local interval, cap = limits(dom)
        -- The caller publishes an item that comes wrapped in a table ahead of the others.
        out[#out + 1] = (interval == 0 and goes_first(dom)) and {item} or item
        taken = taken + 1
        room = room - 1
        if redis_call('HINCRBY', K_INFLIGHT, dom, '1') >= cap
            or redis_call('LLEN', K_QUEUES .. dom) == 0 then
          redis_call('ZREM', K_DOMAINS, dom)
        elseif interval > 0 then
          redis_call('ZADD', K_DOMAINS, int(now + interval), dom)
        else
          redis_call('ZADD', K_DOMAINS, int(now - head_start(dom)), dom)
          again = true
        end
      end
    end
    if #doms < asked and not again then break end
  end
  if taken > 0 then count('queued', -taken) end
  return out
end

-- The deadline set that holds an item in each state (a live item's name is kept only where its
-- state puts it, see KEYS[1] above), and the states whose items have a holder in owners.
local HELD = {l = true, s = true, S = true}

-- Take `item` (in `state`) out of the in-flight or delayed set its state puts it in, and forget
-- its holder. Only that set: a miss in the others would still search them.
local function clear_inflight(item, state)
  local set = STATE_SET[state]
  if set then redis_call('ZREM', set, item) end
  if HELD[state] then redis_call('HDEL', K_OWNERS, item) end
  if state == 'd' or state == 'l' then vacate(domain_of(item)) end
end

-- Leave whatever state `item` is in (`state`) for its domain's queue: at its head when `front`.
local function requeue(item, state, depth, front)
  if state == 'q' then return end
  clear_inflight(item, state)
  live_set(item, 'q', depth)
  count('queued', 1)
  enqueue(item, front)
end

-- Leave whatever state `item` is in for the delayed set, until `due` (Redis time).
local function delay_until(item, state, depth, due)
  if state == 'q' then count('queued', -1) end
  clear_inflight(item, state)
  live_set(item, 'w', depth)
  redis_call('ZADD', K_DELAYED, int(due), item)
end

-- Whether the job's fails and lost hashes (items' failed attempts and vanished holders) are
-- empty, read once a call and kept true by every write through the functions below: most items
-- never fail, and each page's steps would otherwise read and clear both for nothing. nil: not
-- read yet in this call.
local fails_empty, lost_empty

local function no_fails()
  if fails_empty == nil then fails_empty = redis_call('EXISTS', K_FAILS) == 0 end
  return fails_empty
end

local function none_lost()
  if lost_empty == nil then lost_empty = redis_call('EXISTS', K_LOST) == 0 end
  return lost_empty
end

-- The failed attempts of `item` that were its fault.
local function fails_of(item)
  if no_fails() then return 0 end
  return tonumber(redis_call('HGET', K_FAILS, item) or '0')
end

-- How many times a holder of `item` vanished.
local function lost_of(item)
  if none_lost() then return 0 end
  return tonumber(redis_call('HGET', K_LOST, item) or '0')
end

-- One more failed attempt of `item`, or vanished holder; the new count.
local function add_fail(item)
  fails_empty = false
  return redis_call('HINCRBY', K_FAILS, item, '1')
end

local function add_lost(item)
  lost_empty = false
  return redis_call('HINCRBY', K_LOST, item, '1')
end

-- `item` starts afresh: its failed attempts and vanished holders are forgotten.
local function forget_failures(item)
  if not no_fails() then redis_call('HDEL', K_FAILS, item) end
  if not none_lost() then redis_call('HDEL', K_LOST, item) end
end

-- `item` (in `state`) is done: it leaves every per-item key and lives on only in the seen set
-- (so it is never added again); `done` counts it.
local function finish(item, state)
  if state == 'q' then count('queued', -1) end
  clear_inflight(item, state)
  live_del(item)
  forget_failures(item)
  remember_done(item)
  count('done', 1)
end

-- Give up on `item` for good, keeping `reason`.
local function give_up(item, state, depth, reason)
  if state == 'q' then count('queued', -1) end
  clear_inflight(item, state)
  live_set(item, 'X', depth)
  redis_call('HSET', K_DEAD, item, reason)
  count('dead', 1)
end

-- The one retry-or-dead rule. `mode` says whose fault the attempt was:
--   'item'  its download or save raised: counts against max_retries
--   'lost'  the worker holding it vanished (killed, hung, cut off): counts against max_lost
--   'free'  neither (a hand-back, e.g. the broker refused the save): counts nothing
-- A retry waits `delay` seconds in the delayed set first, if that is more than 0.
-- Returns 'retry' or 'dead'.
local function retry_or_dead(item, state, depth, mode, retryable, max_retries, max_lost, reason,
                             front, delay)
  local over = false
  if mode == 'item' then
    over = add_fail(item) > max_retries
  elseif mode == 'lost' then
    over = add_lost(item) > max_lost
  end
  if retryable and not over then
    if delay and delay > 0 then
      delay_until(item, state, depth, redis_now() + us(delay))
    else
      requeue(item, state, depth, front)
    end
    return 'retry'
  end
  give_up(item, state, depth, reason)
  return 'dead'
end

-- -- batches ----------------------------------------------------------------------------------

-- The end of a batch's deferred counting: the counters and tokens written, the live-item buckets
-- split if the batch added enough.
local function end_counts()
  write_counts()
  write_lease_times()
  counts_deferred = false
  if grow_deferred then
    grow_deferred = false
    grow_live()
  end
end

-- A batch of item-script calls in one call (scripts.py's BATCH: a save batch's begins or
-- completes, the calls a process's threads make at the same time): ARGV[1] the calls, then for
-- each its script's name, whether it takes a key of its own ('1' or '0'), its argument count and
-- its arguments; `runs` holds the run function of each name. KEYS are the item keys, then the
-- keys of their own of the calls that take one (KEYS[22] of the script alone), in order. Each
-- call runs with KEYS and ARGV of its own (the job's key names, set by _begin.lua from the
-- batch's KEYS, are the same for every call); the reply is the list of their replies.
-- _begin.lua's checks run once, and so do the dispatch top-up (only the last call's reply hands
-- items out) and the writes of the job's counters. A call that raises ends the batch, the calls
-- before it kept, their counts written.
local ITEM_KEYS = 21
local function batch(runs)
  return function(keys, args)
    local calls = tonumber(args[1])
    local call_keys, replies = {}, {}
    topup_deferred, deferred_topup = true, nil
    counts_deferred = true
    for k = 1, ITEM_KEYS do call_keys[k] = keys[k] end
    local ok, err = pcall(function()
      local at, next_key = 2, ITEM_KEYS + 1
      for i = 1, calls do
        local run = runs[args[at]]
        if not run then error('no batch form of item script ' .. tostring(args[at])) end
        if args[at + 1] == '1' then
          call_keys[ITEM_KEYS + 1] = keys[next_key]
          next_key = next_key + 1
        else
          call_keys[ITEM_KEYS + 1] = nil
        end
        local n = tonumber(args[at + 2])
        local call_args = {}
        for j = 1, n do call_args[j] = args[at + 2 + j] end
        at = at + 3 + n
        replies[i] = run(call_keys, call_args)
      end
      topup_deferred = false
      -- One top-up, with the room the whole batch made, its items after the last reply's own
      -- (whether or not that call reached its top-up: it may have returned early).
      if deferred_topup then
        take_for_dispatch(deferred_topup[1], deferred_topup[2], deferred_topup[3], replies[calls])
      end
    end)
    topup_deferred = false
    end_counts()
    if not ok then error(err, 0) end
    return replies
  end
end
