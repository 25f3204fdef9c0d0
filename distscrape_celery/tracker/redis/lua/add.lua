-- add: deduplicate a batch of items, queue the new ones (within the job's page limits), then top
-- up dispatch.
-- KEYS: the item keys (see _lib_call.lua)
-- ARGV[1] depth       depth of the new items
-- ARGV[2] bound       "<scrape messages> <save pages>": what the broker may hold of this job
--                     (dispatch_room in _lib_frontier.lua)
-- ARGV[3] max_batch   most items to hand out for dispatch in this call
-- ARGV[4] lease       seconds before an undelivered dispatch is reclaimed
-- ARGV[5] priorities  '' (all 0), one priority for all the items, or one per item separated by
--                     spaces (-1000 .. 1000; higher goes first within its domain)
-- ARGV[6..] items     the batch (the caller keeps it small: one call is one block of Redis)
-- Returns {added, dispatch_item...}
local depth = ARGV[1]
local bound, max_batch, lease = ARGV[2], tonumber(ARGV[3]), micros(ARGV[4])
local out = {add_items(ARGV, 6, depth, ARGV[5])}
return take_for_dispatch(bound, max_batch, redis_now() + lease, out)
