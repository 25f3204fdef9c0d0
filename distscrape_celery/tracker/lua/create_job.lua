-- create_job: store a job's spec and its crawl limits if the job is new, and list it among the
-- jobs (and the active ones), in one step, so no job can exist that workers do not maintain.
-- KEYS[1] spec     string the job's spec
-- KEYS[2] jobs     set    names of every job
-- KEYS[3] policy   hash   the job's crawl limits (fields as in _lib.lua)
-- KEYS[4] control  hash   the job's state (fields as in _lib.lua)
-- KEYS[5] active   set    names of the jobs workers maintain
-- ARGV[1] job, ARGV[2] spec JSON
-- ARGV[3..] field, value pairs of the policy (written only when the job is created)
-- Returns {created (1 or 0), the stored spec}
local created = redis.call('SET', KEYS[1], ARGV[2], 'NX') and 1 or 0
if created == 1 and #ARGV > 2 then
  redis.call('HSET', KEYS[3], unpack(ARGV, 3))
end
-- A job created before job states had none: it starts running now.
if redis.call('HEXISTS', KEYS[4], 'state') == 0 then
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[4], 'state', 'running', 'job', ARGV[1],
    'started', t[1] .. '.' .. string.format('%06d', tonumber(t[2])))
  redis.call('SADD', KEYS[5], ARGV[1])
end
redis.call('SADD', KEYS[2], ARGV[1])
return {created, redis.call('GET', KEYS[1])}
