-- create_job: store a job's (or one shard's) spec and its crawl limits if it is new, and list it
-- among the jobs (and the active ones), in one step, so no job can exist that workers do not
-- maintain.
-- KEYS[1] spec     string the job's spec
-- KEYS[2] policy   hash   the job's crawl limits (fields as in _lib_call.lua)
-- KEYS[3] control  hash   the job's state (fields as in _lib_call.lua)
-- KEYS[4] stats    hash   the job's counters (fields as in _lib_call.lua)
-- KEYS[5] jobs     set    names of every job             } only for an unsharded job on one
-- KEYS[6] active   set    names of the jobs workers      } Redis: elsewhere they are in other
--                         maintain                       } slots, and the client lists the job
--                                                          (it has no work before items come)
-- ARGV[1] job, ARGV[2] spec JSON
-- ARGV[3] tokens   where the shard's fencing tokens start (checkout hands out the next ones):
--                  shards count from far apart (keys.SHARD_TOKEN_BITS), so a token names one
--                  lease of the whole job and its shard (keys.body_key)
-- ARGV[4] format   the key layout (keys.JOB_FORMAT), recorded only when the job (shard) is
--                  created: a job made by an older version keeps none, and the item scripts
--                  refuse it
-- ARGV[5] creation  an ID of this creation of the job, recorded as control's `created` when the
--                  spec is stored (item scripts hand it to workers, which so tell a job deleted
--                  and seeded again under its name from the one they built components for)
-- ARGV[6] whole    1: record the creation even if this shard's spec was there (its job is new:
--                  shard 0's spec was not; a delete cut short left this one)
-- ARGV[7] max_duration  seconds from the job's start after which it dispatches nothing more
--                  ('' for no limit), recorded in control with started, since the item scripts
--                  read the two together (written only when the job is created)
-- ARGV[8..] field, value pairs of the policy (written only when the job is created)
-- Returns {created (1 or 0), the stored spec}
local created = redis.call('SET', KEYS[1], ARGV[2], 'NX') and 1 or 0
if created == 1 then
  if tonumber(ARGV[3]) > 0 then redis.call('HSETNX', KEYS[4], 'tokens', ARGV[3]) end
  redis.call('HSET', KEYS[3], 'format', ARGV[4])
  if ARGV[7] ~= '' then redis.call('HSET', KEYS[3], 'max_duration', ARGV[7]) end
  if #ARGV > 7 then redis.call('HSET', KEYS[2], unpack(ARGV, 8)) end
end
if created == 1 or ARGV[6] == '1' then redis.call('HSET', KEYS[3], 'created', ARGV[5]) end
-- A job created before job states had none: it starts running now.
if redis.call('HEXISTS', KEYS[3], 'state') == 0 then
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[3], 'state', 'running', 'job', ARGV[1],
    'started', t[1] .. '.' .. string.format('%06d', tonumber(t[2])))
  if KEYS[6] then redis.call('SADD', KEYS[6], ARGV[1]) end
end
if KEYS[5] then redis.call('SADD', KEYS[5], ARGV[1]) end
return {created, redis.call('GET', KEYS[1])}
