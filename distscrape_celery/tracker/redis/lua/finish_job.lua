-- finish_job: record, once, that every shard of a sharded job was idle at one moment. The caller
-- saw it in two reads of every shard's (state, epoch, seen) that agreed; `epochs` (the shards'
-- epochs, joined) names that idle period, since an epoch only grows. The first caller to name a
-- period wins; everyone else who saw the same period gets 0, so the job_finished event fires once.
-- KEYS[1] control  hash   shard 0's control hash (fields as in _lib_call.lua)
-- ARGV[1] epochs   the shards' epochs, comma-separated, shard 0 first
-- Returns 1 if this call recorded it, else 0
if redis.call('HGET', KEYS[1], 'finished_epochs') == ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'finished_epochs', ARGV[1])
return 1
