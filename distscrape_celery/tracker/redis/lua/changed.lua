-- changed: known items that a source other than their server says changed since they were
-- fetched (a sitemap's lastmod) are queued now, in the running generation, whether or not they
-- are due. Items not known, or live already, are left alone.
-- KEYS: the item keys (see _lib_call.lua)
-- ARGV[1] bound, ARGV[2] max_batch, ARGV[3] lease   dispatch top-up, as in add.lua
-- ARGV[4..] item, when it changed (Unix seconds) pairs (the caller sends at most one batch)
-- Returns {queued, dispatch_item...}
local bound, max_batch, lease = ARGV[1], tonumber(ARGV[2]), micros(ARGV[3])
local queued = 0
for i = 4, #ARGV - 1, 2 do
  local item, changed = ARGV[i], tonumber(ARGV[i + 1])
  local record = known_record(item)
  if record and changed and not live_get(item)
      and changed > records.fetched(record) and queue_known(item, records.depth(record)) then
    queued = queued + 1
  end
end
if queued > 0 then
  grow_live()
  reactivate()
end
local out = {queued}
return take_for_dispatch(bound, max_batch, redis_now() + lease, out)
