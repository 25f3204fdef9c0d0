-- add: deduplicate a batch of items, queue the new ones, then top up dispatch.
-- KEYS: the item keys (see _lib.lua)
-- ARGV[1] depth       depth of the new items
-- ARGV[2] bound       most messages of this job the broker may hold
-- ARGV[3] max_batch   most items to hand out for dispatch in this call
-- ARGV[4] lease       seconds before an undelivered dispatch is reclaimed
-- ARGV[5..] items     the batch (the caller keeps it small: one call is one block of Redis)
-- Returns {added, dispatch_item...}
local depth = ARGV[1]
local bound, max_batch, lease = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local added = 0
for i = 5, #ARGV do
  -- HSETNX is the dedup decision: 1 means never seen in this job.
  if redis.call('HSETNX', K_ITEMS, ARGV[i], 'q' .. depth) == 1 then
    redis.call('RPUSH', K_FRONTIER, ARGV[i])
    added = added + 1
  end
end
if added > 0 then
  redis.call('HINCRBY', K_STATS, 'seen', added)
  redis.call('HINCRBY', K_STATS, 'queued', added)
end
local out = {added}
return take_for_dispatch(bound, max_batch, redis_now() + lease, out)
