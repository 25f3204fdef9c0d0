-- The item scripts' library, part 2 of 10 (scripts.LIBRARY names the files in the order they are
-- joined): the job's counters and fencing tokens, and the job's state.

-- -- the job's counters ------------------------------------------------------------------------
-- The stats fields of the bucketed sets (_lib_seen.lua): the seen set's size, and the level and
-- split pointer of the seen set and of the live-item buckets. Every job keeps them under these
-- short names (keys.JOB_FORMAT 4), so the stored names stay; the table's keys say what each holds
-- (one table, not eight locals: the library's locals count against Lua's limit of 200).
local STAT = {
  seen_size = 'fn', seen_level = 'fl', seen_split = 'fs', live_level = 'il', live_split = 'is',
  -- The known items' size, level and split pointer (_lib_known.lua).
  known_size = 'kn', known_level = 'kl', known_split = 'ks',
}
-- The counters in stats that calls add to; a batch writes them in this order. unchanged and gone
-- count the revisits of this generation that found the page as it was, or gone (404, 410);
-- noindex and canonical the pages done unsaved because of what they said (complete.lua).
local COUNTERS = {'seen', 'queued', 'done', 'dead', STAT.seen_size, 'links_cut', STAT.known_size,
  'unchanged', 'gone', 'noindex', 'canonical'}

-- Add `n` (a number) to the job's counter `field`.
local function count(field, n)
  if counts_deferred then
    deltas[field] = (deltas[field] or 0) + n
  else
    redis_call('HINCRBY', K_STATS, field, int_text(n))
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
    if n and n ~= 0 then redis_call('HINCRBY', K_STATS, field, int_text(n)) end
  end
  if tokens_taken > 0 then redis_call('HINCRBY', K_STATS, 'tokens', int_text(tokens_taken)) end
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

-- Whether the job's time budget ran out (Redis's clock past started + max_duration). It is
-- expired in all but name until maintain records it (expired_end in maintain.lua).
local function out_of_time()
  return budget_end and redis_now() >= budget_end
end

-- A paused, cancelled or expired job hands out nothing (nor does one out of time); what is in
-- flight goes on.
local function dispatch_held()
  local s = job_state()
  return s == 'paused' or s == 'cancelled' or s == 'expired' or out_of_time()
end

-- The job ends as `state` (finished, cancelled or expired): its end time and figures are
-- recorded, and workers stop maintaining it. The epoch counts these ends: a sharded job is
-- finished when two reads of every shard's state and epoch agree (redis/shards.py), so no shard
-- finished again in between unseen. An expired job's figures also name the items it left queued
-- (final_queued: every item neither done nor dead, since none is in flight when it expires).
local function record_end(state)
  local c = counters('seen', 'done', 'dead', 'unchanged', 'gone')
  local ended = str_format('%.6f', redis_now() / 1000000)
  redis_call('HSET', K_CONTROL, 'state', state, 'ended', ended,
    'final_seen', int_text(c[1]), 'final_done', int_text(c[2]), 'final_dead', int_text(c[3]),
    'final_unchanged', int_text(c[4]), 'final_gone', int_text(c[5]))
  if state == 'expired' then
    redis_call('HSET', K_CONTROL, 'final_queued', int_text(c[1] - c[2] - c[3]))
  end
  job_state_now = state
  redis_call('HINCRBY', K_CONTROL, 'epoch', '1')
  if job_name then redis_call('SREM', K_ACTIVE, job_name) end
  reactivated = false
end

-- New work arrived (items added, dead ones queued again): a finished job runs again, and one
-- that is not cancelled is maintained again. An expired job stays expired: its time is spent,
-- and the new items wait in its queues.
local function reactivate()
  if reactivated then return end
  local state = job_state()
  if state == 'finished' then
    set_job_state('running')
    redis_call('HDEL', K_CONTROL, 'ended')
  end
  if state ~= 'cancelled' and state ~= 'expired' and job_name then
    redis_call('SADD', K_ACTIVE, job_name)
  end
  reactivated = true
end

