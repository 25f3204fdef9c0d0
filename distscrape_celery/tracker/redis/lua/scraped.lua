-- scraped: a worker downloaded its leased item. Queue the items found in it (deduplicated, within
-- the page limits) and, if the caller still holds the lease, keep the body it staged for the save
-- task and make the item save-pending: it then waits for its save message for up to
-- save_timeout, and no other worker scrapes it meanwhile. The caller stages the body with a SET
-- just before this call, in the same round trip (a body that went through Lua would be copied
-- and hashed byte by byte); a stale holder's body is dropped here, so it has nothing to drop.
-- A stale holder's finds are still queued (they are real), but the item is left alone.
-- KEYS: the item keys (see _lib_call.lua), then
-- KEYS[22] body         where the caller staged the body (keys.body_key of the token; the token's
--                       shard is the item's, so it shares the slot); absent: nothing staged
-- ARGV[1] item
-- ARGV[2] token         the caller's fencing token
-- ARGV[3] save_timeout  seconds the save message may take to start
-- ARGV[4] depth         depth of the found items
-- ARGV[5] bound, ARGV[6] max_batch, ARGV[7] lease   dispatch top-up, as in add.lua
-- ARGV[8] saver         '' or the id of the calling worker, which saves the item itself at once
--                       (save_inline): the item turns saving under its lease, as begin_save
--                       would make it, and nothing is staged (the caller has the body)
-- ARGV[9] keeper        '' or the id of the calling worker, which queues the save message later
--                       (with those of other pages): until it hands the item over (handoff.lua)
--                       the item waits under the keeper's lease, so if the keeper dies first the
--                       item is reclaimed a lease later, not a save timeout later
-- ARGV[10] cut          links of the page left out past max_links_per_page: added to the
--                       job's links_cut count (a figure of its status)
-- ARGV[11] priorities  of the found items, as in add.lua
-- ARGV[12] carry       '1': the caller goes on with one more item itself, in the slot its fetch
--                      frees: if it still holds the lease, take_carried hands it one past the
--                      dispatch bound, first of the items
-- ARGV[13..] found items (the caller sends at most one batch; more go through add.lua first)
-- Returns {status, added, dispatch_item...}; status is ok|stale
local item, token, save_timeout = ARGV[1], ARGV[2], micros(ARGV[3])
local depth = ARGV[4]
local bound, max_batch, lease = ARGV[5], tonumber(ARGV[6]), micros(ARGV[7])
local body_key = KEYS[22]
local saver, keeper = ARGV[8], ARGV[9]
local added = add_items(ARGV, 13, depth, ARGV[11])
if tonumber(ARGV[10]) > 0 then count('links_cut', tonumber(ARGV[10])) end
local now = redis_now()
local status = 'stale'
local v = live_get(item)
if v then
  local state, item_depth = split_state(v)
  local owner, held = holder(item)
  if state == 'l' and held == token then
    local domain = domain_of(item)
    -- The lease began lease seconds before its deadline (a heartbeat that extended it makes
    -- this shorter, which only lessens the domain's head start).
    local deadline = redis_call('ZSCORE', K_LEASED, item)
    if deadline then record_lease_time(domain, tonumber(deadline) - lease) end
    sites.stop(item, domain)  -- its fetch is over
    vacate(domain)
    if saver ~= '' then
      -- Saved by its holder now: under a lease its heartbeat keeps, recovered as a save whose
      -- process died if the holder vanishes.
      redis_call('ZADD', K_LEASED, int_text(now + lease), item)
      if owner ~= saver then redis_call('HSET', K_OWNERS, item, saver .. ' ' .. token) end
      live_set(item, 'S', item_depth)
    else
      redis_call('ZREM', K_LEASED, item)
      if keeper ~= '' then
        redis_call('ZADD', K_PENDING, int_text(now + lease), item)
        -- Its holder keeps it (the same owner entry, unless another worker id keeps it).
        if owner ~= keeper then redis_call('HSET', K_OWNERS, item, keeper .. ' ' .. token) end
      else
        redis_call('ZADD', K_PENDING, int_text(now + save_timeout), item)
        -- Its save message is in the broker now, not with any worker: no holder, same token.
        redis_call('HSET', K_OWNERS, item, '- ' .. token)
      end
      live_set(item, 's', item_depth)
    end
    status = 'ok'
  end
end
if body_key and status ~= 'ok' then redis_call('UNLINK', body_key) end
local out = {status, added}
if ARGV[12] == '1' and status == 'ok' then take_carried(bound, now + lease, out) end
return take_for_dispatch(bound, max_batch, now + lease, out)
