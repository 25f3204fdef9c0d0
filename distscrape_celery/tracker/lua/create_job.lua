-- create_job: store a job's spec if the job is new and list it among the jobs, in one step, so
-- no job can exist that workers do not maintain.
-- KEYS[1] spec   string the job's spec
-- KEYS[2] jobs   set    names of every job
-- ARGV[1] job, ARGV[2] spec JSON
-- Returns {created (1 or 0), the stored spec}
local created = redis.call('SET', KEYS[1], ARGV[2], 'NX') and 1 or 0
redis.call('SADD', KEYS[2], ARGV[1])
return {created, redis.call('GET', KEYS[1])}
