-- Helpers shared by the item scripts. The tracker prepends this file to each script once, when it
-- registers them (Redis scripts cannot include one another).
--
-- Item scripts all take the same KEYS, in this order:
--   KEYS[1] items       hash  item -> state letter .. depth  (q queued, d dispatched, l leased,
--                             D done, X dead); also the dedup set
--   KEYS[2] frontier    list  items waiting for dispatch; an entry whose item is no longer 'q' is stale
--   KEYS[3] dispatched  zset  item -> deadline: a Celery message exists, no worker has started it
--   KEYS[4] leased      zset  item -> deadline: a worker holds it
--   KEYS[5] owners      hash  leased item -> worker id
--   KEYS[6] stats       hash  counters seen, queued, done, dead
--   KEYS[7] fails       hash  item -> failed attempts
--   KEYS[8] dead        hash  item -> why it was given up on
-- Every deadline is on Redis's clock (TIME), never a worker's.

local K_ITEMS, K_FRONTIER, K_DISPATCHED, K_LEASED = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_OWNERS, K_STATS, K_FAILS, K_DEAD = KEYS[5], KEYS[6], KEYS[7], KEYS[8]

local function redis_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function split_state(v)
  return string.sub(v, 1, 1), string.sub(v, 2)
end

-- Move queued items from the frontier to `dispatched` until the broker holds `bound` messages of
-- this job (at most `max_batch` per call) and return them; the caller publishes one task for each.
-- Stale frontier entries are dropped on the way.
local function take_for_dispatch(bound, max_batch, deadline, out)
  local room = bound - redis.call('ZCARD', K_DISPATCHED)
  if room > max_batch then room = max_batch end
  local taken = 0
  while room > 0 do
    local item = redis.call('LPOP', K_FRONTIER)
    if not item then break end
    local v = redis.call('HGET', K_ITEMS, item)
    if v then
      local state, depth = split_state(v)
      if state == 'q' then
        redis.call('HSET', K_ITEMS, item, 'd' .. depth)
        redis.call('ZADD', K_DISPATCHED, deadline, item)
        out[#out + 1] = item
        taken = taken + 1
        room = room - 1
      end
    end
  end
  if taken > 0 then redis.call('HINCRBY', K_STATS, 'queued', -taken) end
  return out
end

-- Take `item` out of whatever in-flight set holds it.
local function clear_inflight(item)
  redis.call('ZREM', K_DISPATCHED, item)
  redis.call('ZREM', K_LEASED, item)
  redis.call('HDEL', K_OWNERS, item)
end
