-- checkout: lease one item to a worker. Exactly one of many racing callers gets 'ok'; a done or
-- dead item is never leased again. A lease whose deadline passed may be taken over.
-- KEYS: the item keys (see _lib.lua)
-- ARGV[1] item
-- ARGV[2] worker      id of the worker taking the lease
-- ARGV[3] lease       lease length in seconds
-- ARGV[4] bound, ARGV[5] max_batch   dispatch top-up, as in add.lua (checkout frees a slot)
-- Returns {status, depth, failed_attempts, dispatch_item...}; status is ok|busy|done|dead|unknown
local item, worker = ARGV[1], ARGV[2]
local lease, bound, max_batch = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local v = redis.call('HGET', K_ITEMS, item)
if not v then return {'unknown', 0, 0} end
local state, depth = split_state(v)
local fails = tonumber(redis.call('HGET', K_FAILS, item) or '0')
if state == 'D' then return {'done', tonumber(depth), fails} end
if state == 'X' then return {'dead', tonumber(depth), fails} end
local now = redis_now()
if state == 'l' then
  local deadline = tonumber(redis.call('ZSCORE', K_LEASED, item) or '0')
  if deadline > now then return {'busy', tonumber(depth), fails} end
elseif state == 'q' then
  -- Leased straight from the frontier (a redelivered message): its frontier entry goes stale.
  redis.call('HINCRBY', K_STATS, 'queued', -1)
end
redis.call('ZREM', K_DISPATCHED, item)
redis.call('ZADD', K_LEASED, now + lease, item)
redis.call('HSET', K_OWNERS, item, worker)
redis.call('HSET', K_ITEMS, item, 'l' .. depth)
local out = {'ok', tonumber(depth), fails}
return take_for_dispatch(bound, max_batch, now + lease, out)
