-- control: pause, resume or cancel a job. Pause holds dispatch (what is in flight goes on);
-- resume lets it flow again at once (a cancelled job too); cancel holds dispatch for good and
-- ends the job (its end time and figures are recorded, workers stop maintaining it; its data
-- stays). A finished job cannot be paused or cancelled, and resuming it changes nothing. An
-- expired job (its max_duration ran out) cannot be paused, cancelled or resumed: its budget
-- counts from its start, so it would expire again at once; its queued items stay, for export or
-- for a new job.
-- KEYS: the item keys (see _lib_call.lua)
-- ARGV[1] action      pause|resume|cancel
-- ARGV[2] bound, ARGV[3] max_batch, ARGV[4] lease   dispatch top-up, as in add.lua
-- ARGV[5] shard       1: these are one shard's keys of a sharded job, whose shards finish one by
--                     one: a finished shard is paused or cancelled like a running one (new items
--                     must not make it dispatch while the job is held)
-- Returns {state before, state after, dispatch_item...}; an error 'JOBSTATE ...' for a pause or
-- cancel of a finished job, or any action on an expired one
local action = ARGV[1]
local bound, max_batch, lease = ARGV[2], tonumber(ARGV[3]), micros(ARGV[4])
local shard = ARGV[5] == '1'
local before = job_state()
local after = before
if before == 'finished' and action ~= 'resume' and not shard then
  return redis.error_reply('JOBSTATE the job is finished')
end
if before == 'expired' and shard then
  -- One shard of a sharded job ran out of time (the others may still drain): it stays expired.
  return take_for_dispatch(bound, max_batch, redis_now() + lease, {before, before})
elseif before == 'expired' then
  return redis.error_reply('JOBSTATE the job expired: its max_duration ran out, so it ' ..
    'dispatches nothing more (its queued items stay; export them or seed a new job)')
end
if action == 'pause' and (before == 'running' or before == 'finished') then
  set_job_state('paused')
  after = 'paused'
elseif action == 'cancel' and before ~= 'cancelled' then
  record_end('cancelled')
  after = 'cancelled'
elseif action == 'resume' and (before == 'paused' or before == 'cancelled') then
  set_job_state('running')
  redis_call('HDEL', K_CONTROL, 'ended')
  reactivate()
  after = 'running'
end
local out = {before, after}
return take_for_dispatch(bound, max_batch, redis_now() + lease, out)
