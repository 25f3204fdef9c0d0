-- The item scripts' library, part 1 of 10: what every call shares (its keys, its caches, Redis's
-- clock, numbers as text). scripts.LIBRARY names the library's files in the order they are joined,
-- each section needing only those before it; a script runs the library, then _begin.lua, then its
-- own file, with the call's KEYS and ARGV (scripts.py). The item scripts all take the same KEYS:
--   KEYS[1]  items       the prefix of the live-item buckets: `KEYS[1] .. n` is a hash of the live
--                        items' fingerprints -> state and depth (see _lib_live.lua;
--                        JobKeys.item_bucket in keys.py). The states are the letters of
--                        ItemState in tracker/model.py, which says what each means (a unit test
--                        checks CODE and LETTER, in _lib_live.lua, against it):
--                              q queued      w delayed       d dispatched    l leased
--                              s save pending                S saving        X dead
--                              A done item (D) is removed (item_value reports it as 'D0' from the
--                              seen set: done items cost only their fingerprint). A live item's
--                              name is kept only where its state puts it: its domain's queue (q),
--                              delayed (w), dispatched (d), leased (l, S), pending (s), dead (X)
--   KEYS[2]  queues      the prefix of the per-domain queues: `KEYS[2] .. domain` is a list of
--                        the domain's queued items of priority 0, and `KEYS[2] .. domain .. '/p'`
--                        a zset of those of any other priority (score: priority, then arrival,
--                        see queue_score in _lib_politeness.lua); entries whose state moved on
--                        are skipped when popped. The same rules as JobKeys.domain_queue and
--                        JobKeys.priority_queue in keys.py (a domain holds no '/')
--   KEYS[3]  dispatched  zset  d items -> deadline
--   KEYS[4]  leased      zset  l and S items -> deadline: a worker is working on them
--   KEYS[5]  owners      hash  l, s and S items -> "<worker id> <fencing token>"
--   KEYS[6]  stats       hash  counters: seen (items added), queued (q items), done, dead; tokens
--                              (last token); arrivals (items queued in a priority zset, for
--                              their order); fn, fl and fs, the seen set's size, level and split
--                              pointer (_lib_seen.lua); il and is, the live-item
--                              buckets' level and split pointer (their size is seen - done)
--   KEYS[7]  fails       hash  item -> failed attempts that were the item's fault
--   KEYS[8]  dead        hash  item -> why it was given up on
--   KEYS[9]  pending     zset  s items -> deadline (long: the save message may wait in the broker)
--   KEYS[10] lost        hash  item -> times the worker holding it vanished
--   KEYS[11] spec        string the job's spec: an item operation on a job without one is an error
--   KEYS[12] domains     zset  domain -> when it may next be dispatched; exactly the domains whose
--                              queue is not empty and whose in-flight count is under their cap
--   KEYS[13] inflight    hash  domain -> its d and l items (messages and fetches under way)
--   KEYS[14] sites       the prefix of the sites' keys (the budget of a site, shared by the jobs
--                        crawling it; see _lib_politeness.lua and keys.SITES): `s:<site>` when
--                        its next fetch may start, `f:<site>` its fetches under way, `j:<site>`
--                        the limits of the jobs that fetched from it lately
--   KEYS[15] dseen       hash  domain -> items added (kept only with max_pages_per_domain)
--   KEYS[16] delayed     zset  w items -> when their backoff ends
--   KEYS[17] policy      hash  the job's crawl limits, written once by create_job: interval and
--                              concurrency (every domain's), i:<domain> and c:<domain> (one
--                              domain's), delay:<domain> (its robots.txt Crawl-delay), pace
--                              ('ip': the job's sites are its domains' addresses; missing: the
--                              domains), a:<domain> (the domain's address, with pace ip), max_pages,
--                              max_pages_per_domain, id_domain (the domain of items that are not
--                              http(s) URLs); a missing field is no limit
--   KEYS[18] control     hash  the job's state (running, paused, cancelled, finished, expired;
--                              missing: running), job (its name), started, ended, final_seen,
--                              final_done, final_dead (figures recorded when it ended; an
--                              expired job's final_queued too), epoch (ends so far),
--                              max_duration (seconds from started after which nothing more is
--                              dispatched; missing: no limit), priorities (1 once an item of a
--                              priority other than 0 was queued: only then are the domains'
--                              priority zsets looked at),
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
-- Callers pass durations in seconds; micros() converts them. Lua's doubles hold these integers
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
local K_DOMAINS, K_INFLIGHT, K_SITES, K_DSEEN
local K_DELAYED, K_POLICY, K_CONTROL, K_ACTIVE
local K_SEEN, K_LATENCY
-- The job's state, read with its format once a call (every call's dispatch top-up asks for it):
-- set_job_state keeps it current when the call changes it.
local job_state_now
-- When the job's time budget (control's started + max_duration) runs out, in microseconds on
-- Redis's clock; false without one. Read with the job's state, so a job without a budget pays
-- nothing for it.
local budget_end
-- Whether the job ever queued an item of a priority other than 0 (control's priorities): until
-- then its queues are the lists alone, as for every job that uses no priorities.
local priorities_used
-- Which creation of the job this is (create_job.lua), and from its second generation on which
-- generation: checkout and begin_save hand it to the worker, whose components built from an
-- earlier job of the same name (or for an earlier generation) must not be used.
local job_created
-- The call's caches (begin).
local now_cache, id_domain, limits_cache, head_starts
-- The fingerprints and domains of the items in flight: unlike the caches above they outlive the
-- call in a function library, since each is a function of the item's name alone (a URL's domain; an
-- item that is not an http(s) URL takes its job's id_domain, which is not kept here). An item's
-- five steps are five calls, and each would compute them again (a SHA-1, a pattern match). They are
-- kept in two generations of ITEM_CACHE_SIZE entries (an item's fingerprint, or its domain): a
-- full generation becomes the old one, the old one is dropped, and an entry found in the old one
-- moves to the new. That bounds the memory they take in Redis's Lua and its collector's work,
-- which sweeps every live object at each of its cycles: kept by the ten thousand, they cost more
-- than they saved. The items that add_items adds are not kept
-- (most are a page's links, found once and queued far longer than a generation lasts).
local ITEM_CACHE_SIZE = 2048
local fingerprint_cache, fingerprint_high_cache, domain_cache, cache_count = {}, {}, {}, 0
local old_fingerprint_cache, old_fingerprint_high_cache, old_domain_cache = {}, {}, {}
-- False while add_items looks at the items it is given: those are not cached.
local caching_items = true

-- Room for one more entry (an item's fingerprint or domain) in the new generation.
local function make_cache_room()
  if cache_count >= ITEM_CACHE_SIZE then
    old_fingerprint_cache, old_fingerprint_high_cache = fingerprint_cache, fingerprint_high_cache
    old_domain_cache = domain_cache
    fingerprint_cache, fingerprint_high_cache, domain_cache, cache_count = {}, {}, {}, 0
  end
  cache_count = cache_count + 1
end
-- Lease times (lease_mean): by domain, and the job's; the domains whose mean a batch changed
-- and has yet to write, as a set and in order.
local lease_means, job_mean, means_unwritten, means_unwritten_order
-- The seen set and the live items (_lib_seen.lua; the seen set's size is `seen.count`), set by
-- new_sets (_lib_known.lua).
local seen, live, STATE_SET
-- The known items (_lib_known.lua): their bucketed set (with `names`, the prefix of their
-- names' lists, and `count`, their number, read with the others' geometry). One table: a Lua
-- function has at most 60 upvalues, and begin (_begin.lua) sets nearly that many.
local known
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
local function int_text(n)
  local t = small_texts[n] or texts[n]
  if t then return t end
  t = str_format('%d', n)
  if n >= 0 and n < SMALL_TEXTS then small_texts[n] = t else texts[n] = t end
  return t
end

-- `seconds` (a number or its text) in whole microseconds.
local function micros(seconds)
  return math.floor(tonumber(seconds) * 1000000 + 0.5)
end

-- An item's rank: its depth and its priority in one integer, priority * DEPTH_SPAN + depth,
-- which the live-item buckets pack with its state (pack in _lib_live.lua) and the scripts pass
-- around as the item's "depth". An item of priority 0 (every item of a job that uses none) has
-- its depth for rank, so its packed value is the same small integer as ever; the priority rides
-- with the item through every state, so a retried or requeued item keeps it. Depths are kept
-- below DEPTH_SPAN (deeper items count as DEPTH_SPAN - 1); priorities lie within
-- -PRIORITY_MAX .. PRIORITY_MAX (tracker.base.PRIORITY_MAX).
local DEPTH_SPAN = 16777216  -- 2^24
local PRIORITY_MAX = 1000

local function rank_of(depth, priority)
  local d = tonumber(depth)
  if d >= DEPTH_SPAN then d = DEPTH_SPAN - 1 end
  return priority * DEPTH_SPAN + d
end

-- The depth of a rank (a number or its text).
local function depth_of(rank)
  return tonumber(rank) % DEPTH_SPAN
end

-- The priority of a rank (a number or its text).
local function priority_of(rank)
  local r = tonumber(rank)
  return (r - r % DEPTH_SPAN) / DEPTH_SPAN
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

