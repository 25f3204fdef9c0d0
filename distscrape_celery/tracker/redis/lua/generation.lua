-- generation: start the job's next generation (of this shard): it runs again from its seeds, and
-- a job that revisits fetches again its known items that are due (_lib_generation.lua). Exactly
-- one of many racing callers starts a given generation.
-- KEYS: the item keys (see _lib_call.lua)
-- ARGV[1] generation  the generation to start; a shard already at it (or past it) is left alone
-- ARGV[2] due         '' (start now), or the due time (control's next_due, Unix seconds as text)
--                     the caller read: the generation starts only if it is still the job's next
--                     due time and it has come (a schedule's run)
-- ARGV[3] next_due    '' or the job's next due time to record (Unix seconds as text)
-- ARGV[4] check       '1': only an idle job (finished or expired) starts again; '0': a shard of
--                     a sharded job, which its caller found idle as a whole
-- ARGV[5] bound, ARGV[6] max_batch, ARGV[7] lease   dispatch top-up, as in add.lua
-- ARGV[8..] the seeds (of this shard), added at depth 0, or queued if known (due or not)
-- Returns {status, generation, next_due, dispatch_item...}: status is started, current (the
-- shard is at that generation already), moved (the due time is not ARGV[2] any more), early
-- (it has not come), or the job's state when it is not idle (running, paused, cancelled);
-- generation is the shard's now, next_due control's ('' if none)
local target = tonumber(ARGV[1])
local control = redis_call('HMGET', K_CONTROL, 'generation', 'next_due')
local generation, due = tonumber(control[1] or '1'), control[2] or ''
if generation >= target then return {'current', generation, due} end
if ARGV[2] ~= '' then
  if due ~= ARGV[2] then return {'moved', generation, due} end
  if redis_now() < micros(due) then return {'early', generation, due} end
end
local state = job_state()
if ARGV[4] == '1' and state ~= 'finished' and state ~= 'expired' then
  return {state, generation, due}
end
begin_generation(target, ARGV[3])
-- Every generation fetches its seeds, due or not: they are where it starts (and where a page's
-- robots.txt offers its sitemaps).
local seeds_known = false
for i = 8, #ARGV do
  local record = known_record(ARGV[i])
  if record and queue_known(ARGV[i], records.depth(record)) then seeds_known = true end
end
if seeds_known then grow_live() end
add_items(ARGV, 8, 0)
local bound, max_batch, lease = ARGV[5], tonumber(ARGV[6]), micros(ARGV[7])
local out = {'started', target, ARGV[3] ~= '' and ARGV[3] or due}
return take_for_dispatch(bound, max_batch, redis_now() + lease, out)
