-- scraped: a worker downloaded its leased item and staged the body. Queue the items found in it
-- (deduplicated, within the page limits) and, if the caller still holds the lease, make the item
-- save-pending: it then waits for its save message for up to save_timeout, and no other worker
-- scrapes it meanwhile.
-- A stale holder's finds are still queued (they are real), but the item is left alone.
-- KEYS: the item keys (see _lib.lua)
-- ARGV[1] item
-- ARGV[2] token         the caller's fencing token
-- ARGV[3] save_timeout  seconds the save message may take to start
-- ARGV[4] depth         depth of the found items
-- ARGV[5] bound, ARGV[6] max_batch, ARGV[7] lease   dispatch top-up, as in add.lua
-- ARGV[8..] found items (the caller sends at most one batch; more go through add.lua first)
-- Returns {status, added, dispatch_item...}; status is ok|stale
local item, token, save_timeout = ARGV[1], ARGV[2], tonumber(ARGV[3])
local depth = ARGV[4]
local bound, max_batch, lease = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local added = add_items(8, depth)
local now = redis_now()
local status = 'stale'
local v = redis.call('HGET', K_ITEMS, item)
if v then
  local state, item_depth = split_state(v)
  local _, held = holder(item)
  if state == 'l' and held == token then
    redis.call('ZREM', K_LEASED, item)
    vacate(domain_of(item))  -- its fetch is over
    redis.call('ZADD', K_PENDING, now + save_timeout, item)
    -- Its save message is in the broker now, not with any worker: no holder, same token.
    redis.call('HSET', K_OWNERS, item, '- ' .. token)
    redis.call('HSET', K_ITEMS, item, 's' .. item_depth)
    status = 'ok'
  end
end
local out = {status, added}
return take_for_dispatch(bound, max_batch, now + lease, out)
