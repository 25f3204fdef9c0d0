-- checkout: lease one item to a worker for scraping, under a new fencing token. Exactly one of many
-- racing callers gets 'ok'; a done or dead item is never leased again, and an item whose save is
-- pending, or that waits out a backoff, is not scraped now. A lease whose deadline passed may be
-- taken over: its holder vanished, which counts against max_lost.
-- Politeness holds at fetch time, whatever the broker delivered when: the lease takes its
-- site's fetch slot (the next one opens the site's interval later, on Redis's clock; a site's
-- budget is shared by every job crawling it, see _lib_politeness.lua). If the slot is not open
-- yet, the site has as many fetches under way as its cap, or (for an item leased straight from
-- its queue) the domain is at its in-flight cap,
-- the item goes back to the head of its domain's queue and the caller gets 'throttled' with the
-- seconds until the slot opens: the worker's slot is free at once, and no countdown is used.
-- While the job is paused or cancelled, or out of time (its max_duration ran out), a delivered
-- item goes back to its queue the same way ('held'); a lease in hand is kept.
-- KEYS: the item keys (see _lib_call.lua)
-- ARGV[1] item
-- ARGV[2] worker      id of the worker taking the lease
-- ARGV[3] lease       lease length in seconds
-- ARGV[4] bound, ARGV[5] max_batch   dispatch top-up, as in add.lua (checkout frees a slot)
-- ARGV[6] max_lost    as in retry_or_dead
-- ARGV[7] address     optional: the address the worker resolved the item's host to, the
--                     domain's site from now on if the job paces by address (sites.note_address)
-- Returns {status, depth, failed_attempts, token, wait, created, record, dispatch_item...}
-- (depth: the item's hops from a seed, its priority left out of its rank); status is
-- ok|busy|throttled|held|done|dead|unknown; token is 0 unless ok; wait (a string, seconds)
-- is how long a throttled item's domain waits for its next fetch slot; created is the job's
-- creation (_lib_call.lua); record is the item's record in hex if the job knows it from an
-- earlier generation (_lib_known.lua), else ''
local item, worker = ARGV[1], ARGV[2]
local lease, bound, max_batch = micros(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local max_lost = tonumber(ARGV[6])
local v = item_value(item)
if not v then return {'unknown', 0, 0, 0, '0', job_created, ''} end
local state, depth = split_state(v)
local fails = fails_of(item)
if state == 'D' then return {'done', depth_of(depth), fails, 0, '0', job_created, ''} end
if state == 'X' then return {'dead', depth_of(depth), fails, 0, '0', job_created, ''} end
if state == 's' or state == 'w' then
  return {'busy', depth_of(depth), fails, 0, '0', job_created, ''}
end
local now = redis_now()
if state == 'l' or state == 'S' then
  local deadline = tonumber(redis_call('ZSCORE', K_LEASED, item) or '0')
  if deadline > now then return {'busy', depth_of(depth), fails, 0, '0', job_created, ''} end
  local was = holder(item) or '?'
  if retry_or_dead(item, state, depth, 'lost', true, 0, max_lost,
      'its worker vanished too often (last holder ' .. was .. ')', true, 0) == 'dead' then
    return {'dead', depth_of(depth), fails, 0, '0', job_created, ''}
  end
  state = 'q'
end
local domain = domain_of(item)
if dispatch_held() then
  -- Paused or cancelled: the item waits in its queue until the job is resumed. Out of time: it
  -- stays queued, counted in the job's final figures.
  if state == 'd' then undispatch(item, depth, domain) end
  return {'held', depth_of(depth), fails, 0, '0', job_created, ''}
end
if ARGV[7] and ARGV[7] ~= '' then sites.note_address(domain, ARGV[7]) end
local interval, cap, site = limits(domain)
local slot = sites.opens(domain, site, interval, cap)
if slot > now or (state == 'q' and inflight(domain) >= cap) then
  if state == 'd' then undispatch(item, depth, domain) end
  -- A queued item keeps its place; the domain's next turn is no earlier than its slot.
  if slot > now then redis_call('ZADD', K_DOMAINS, 'XX', 'GT', int_text(slot), domain) end
  local wait = slot - now
  if wait < 0 then wait = 0 end
  local out = {'throttled', depth_of(depth), fails, 0, str_format('%.3f', wait / 1000000),
    job_created, ''}
  return take_for_dispatch(bound, max_batch, now + lease, out)
end
if state == 'q' then
  -- Leased straight from its queue (a redelivered message): its queue entry goes stale.
  count('queued', -1)
  occupy(domain)
end
local token = new_token()
redis_call('ZREM', K_DISPATCHED, item)
redis_call('ZADD', K_LEASED, int_text(now + lease), item)
sites.start(item, site, now + lease)
redis_call('HSET', K_OWNERS, item, worker .. ' ' .. int_text(token))
live_set(item, 'l', depth)
-- What fetching a known item again needs (a job that revisits), for the worker, in hex.
local record = known_record(item)
record = record and records.to_hex(record) or ''
local out = {'ok', depth_of(depth), fails, token, '0', job_created, record}
return take_for_dispatch(bound, max_batch, now + lease, out)
