-- The start of every item script call, after the library (scripts.LIBRARY): the job's key names
-- from the call's KEYS, the library's caches emptied, the job checked (it returns an error reply
-- if the job is missing or of another layout). In a script (EVAL) this runs at the top level; in
-- the function library it is the body of begin(KEYS), called first by every function (scripts.py).
redis_call, str_format, str_sub = redis.call, string.format, string.sub
K_ITEMS, K_QUEUES, K_DISPATCHED, K_LEASED = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
K_OWNERS, K_STATS, K_FAILS, K_DEAD = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
K_PENDING, K_LOST, K_SPEC = KEYS[9], KEYS[10], KEYS[11]
K_DOMAINS, K_INFLIGHT, K_SITES, K_DSEEN = KEYS[12], KEYS[13], KEYS[14], KEYS[15]
K_DELAYED, K_POLICY, K_CONTROL, K_ACTIVE = KEYS[16], KEYS[17], KEYS[18], KEYS[19]
K_SEEN, K_LATENCY = KEYS[20], KEYS[21]
now_cache, id_domain = nil, nil
lease_means, job_mean, means_unwritten, means_unwritten_order = {}, nil, {}, {}
topup_deferred, deferred_topup = false, nil
counts_deferred, deltas, token_base, tokens_taken, grow_deferred = false, {}, nil, 0, false
page_limits, reactivated = nil, false
fails_empty, lost_empty = nil, nil
limits_cache, head_starts, texts, caching_items = {}, {}, {}, true
sites.budgets = {}
new_sets()
STATE_SET = {d = K_DISPATCHED, l = K_LEASED, S = K_LEASED, s = K_PENDING, w = K_DELAYED}
if redis_call('EXISTS', K_SPEC) == 0 then
  return redis.error_reply('NOJOB no such job: ' .. K_SPEC)
end
local control = redis_call('HMGET', K_CONTROL, 'format', 'state', 'created', 'job', 'started',
  'max_duration', 'priorities', 'generation')
if control[1] ~= '4' then
  return redis.error_reply('JOBFORMAT the job was created by an older distscrape (its items ' ..
    'are kept another way); export what you need, delete it and seed it again')
end
job_state_now = control[2] or 'running'
-- A later generation is another creation to the workers: what they built or kept for the last
-- one (the links they know were added, the sitemaps they offered) starts afresh.
job_created = (control[3] or '') .. (control[8] and ('/' .. control[8]) or '')
job_name = control[4]
budget_end = control[6] and micros(control[5] or '0') + micros(control[6]) or false
priorities_used = control[7] == '1'
