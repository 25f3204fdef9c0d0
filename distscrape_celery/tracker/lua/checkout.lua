-- checkout: lease one item to a worker for scraping, under a new fencing token. Exactly one of many
-- racing callers gets 'ok'; a done or dead item is never leased again, and an item whose save is
-- pending is not scraped again. A lease whose deadline passed may be taken over: its holder
-- vanished, which counts against max_lost.
-- KEYS: the item keys (see _lib.lua)
-- ARGV[1] item
-- ARGV[2] worker      id of the worker taking the lease
-- ARGV[3] lease       lease length in seconds
-- ARGV[4] bound, ARGV[5] max_batch   dispatch top-up, as in add.lua (checkout frees a slot)
-- ARGV[6] max_lost    as in retry_or_dead
-- Returns {status, depth, failed_attempts, token, dispatch_item...};
-- status is ok|busy|done|dead|unknown; token is 0 unless ok
local item, worker = ARGV[1], ARGV[2]
local lease, bound, max_batch = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local max_lost = tonumber(ARGV[6])
local v = redis.call('HGET', K_ITEMS, item)
if not v then return {'unknown', 0, 0, 0} end
local state, depth = split_state(v)
local fails = tonumber(redis.call('HGET', K_FAILS, item) or '0')
if state == 'D' then return {'done', tonumber(depth), fails, 0} end
if state == 'X' then return {'dead', tonumber(depth), fails, 0} end
if state == 's' then return {'busy', tonumber(depth), fails, 0} end
local now = redis_now()
if state == 'l' or state == 'S' then
  local deadline = tonumber(redis.call('ZSCORE', K_LEASED, item) or '0')
  if deadline > now then return {'busy', tonumber(depth), fails, 0} end
  local was = holder(item) or '?'
  if retry_or_dead(item, state, depth, 'lost', true, 0, max_lost,
      'its worker vanished too often (last holder ' .. was .. ')', true) == 'dead' then
    return {'dead', tonumber(depth), fails, 0}
  end
  state = 'q'
end
if state == 'q' then
  -- Leased straight from the frontier (a redelivered message): its frontier entry goes stale.
  redis.call('HINCRBY', K_STATS, 'queued', -1)
end
local token = redis.call('HINCRBY', K_STATS, 'tokens', 1)
redis.call('ZREM', K_DISPATCHED, item)
redis.call('ZADD', K_LEASED, now + lease, item)
redis.call('HSET', K_OWNERS, item, worker .. ' ' .. token)
redis.call('HSET', K_ITEMS, item, 'l' .. depth)
local out = {'ok', tonumber(depth), fails, token}
return take_for_dispatch(bound, max_batch, now + lease, out)
