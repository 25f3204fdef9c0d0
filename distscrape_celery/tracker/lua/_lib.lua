-- Shared by every item script (prepended to each). The item scripts all take the same KEYS:
--   KEYS[1]  items       hash  item -> state letter + depth:
--                              q queued (in the frontier)      d dispatched (a scrape message exists)
--                              l leased (a worker scrapes it)  s save pending (its save message waits)
--                              S saving (a worker saves it)    D done      X dead
--   KEYS[2]  frontier    list  queued items (entries whose state moved on are skipped when popped)
--   KEYS[3]  dispatched  zset  d items -> deadline
--   KEYS[4]  leased      zset  l and S items -> deadline: a worker is working on them
--   KEYS[5]  owners      hash  l, s and S items -> "<worker id> <fencing token>"
--   KEYS[6]  stats       hash  counters: seen, queued (frontier), done, dead; tokens (last token)
--   KEYS[7]  fails       hash  item -> failed attempts that were the item's fault
--   KEYS[8]  dead        hash  item -> why it was given up on
--   KEYS[9]  pending     zset  s items -> deadline (long: the save message may wait in the broker)
--   KEYS[10] lost        hash  item -> times the worker holding it vanished
--   KEYS[11] spec        string the job's spec: an item operation on a job without one is an error
-- Every deadline is on Redis's clock (TIME), never a worker's.

local K_ITEMS, K_FRONTIER, K_DISPATCHED, K_LEASED = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_OWNERS, K_STATS, K_FAILS, K_DEAD = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local K_PENDING, K_LOST, K_SPEC = KEYS[9], KEYS[10], KEYS[11]

if redis.call('EXISTS', K_SPEC) == 0 then
  return redis.error_reply('NOJOB no such job: ' .. K_SPEC)
end

local function redis_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function split_state(v)
  return string.sub(v, 1, 1), string.sub(v, 2)
end

-- The holder of an l, s or S item: worker id and fencing token (nil, nil if none).
local function holder(item)
  local o = redis.call('HGET', K_OWNERS, item)
  if not o then return nil, nil end
  local sp = string.find(o, ' ', 1, true)
  return string.sub(o, 1, sp - 1), string.sub(o, sp + 1)
end

-- Move queued items from the frontier to `dispatched` until the broker holds `bound` messages of
-- this job, scrape and save messages together (at most `max_batch` per call), and return them;
-- the caller publishes one scrape task for each. Stale frontier entries are dropped on the way.
local function take_for_dispatch(bound, max_batch, deadline, out)
  local room = bound - redis.call('ZCARD', K_DISPATCHED) - redis.call('ZCARD', K_PENDING)
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

-- Queue those of ARGV[first..] the job has never seen, at `depth`, and return how many there were.
-- HSETNX is the dedup decision. The caller sends at most one batch (MAX_ADD_BATCH), so a single
-- RPUSH takes every new item: one call less per item than pushing each.
local function add_new(first, depth)
  local state, new = 'q' .. depth, {}
  for i = first, #ARGV do
    if redis.call('HSETNX', K_ITEMS, ARGV[i], state) == 1 then
      new[#new + 1] = ARGV[i]
    end
  end
  if #new > 0 then
    redis.call('RPUSH', K_FRONTIER, unpack(new))
    redis.call('HINCRBY', K_STATS, 'seen', #new)
    redis.call('HINCRBY', K_STATS, 'queued', #new)
  end
  return #new
end

-- Take `item` out of whatever in-flight set holds it, and forget its holder.
local function clear_inflight(item)
  redis.call('ZREM', K_DISPATCHED, item)
  redis.call('ZREM', K_LEASED, item)
  redis.call('ZREM', K_PENDING, item)
  redis.call('HDEL', K_OWNERS, item)
end

-- Leave whatever state `item` is in (`state`) for the frontier: at its head when `front`.
local function requeue(item, state, depth, front)
  if state == 'q' then return end
  clear_inflight(item)
  redis.call('HSET', K_ITEMS, item, 'q' .. depth)
  if front then redis.call('LPUSH', K_FRONTIER, item) else redis.call('RPUSH', K_FRONTIER, item) end
  redis.call('HINCRBY', K_STATS, 'queued', 1)
end

-- Give up on `item` for good, keeping `reason`.
local function give_up(item, state, depth, reason)
  if state == 'q' then redis.call('HINCRBY', K_STATS, 'queued', -1) end
  clear_inflight(item)
  redis.call('HSET', K_ITEMS, item, 'X' .. depth)
  redis.call('HSET', K_DEAD, item, reason)
  redis.call('HINCRBY', K_STATS, 'dead', 1)
end

-- The one retry-or-dead rule. `mode` says whose fault the attempt was:
--   'item'  its download or save raised: counts against max_retries
--   'lost'  the worker holding it vanished (killed, hung, cut off): counts against max_lost
--   'free'  neither (a hand-back, e.g. the broker refused the save): counts nothing
-- Returns 'retry' or 'dead'.
local function retry_or_dead(item, state, depth, mode, retryable, max_retries, max_lost, reason, front)
  local over = false
  if mode == 'item' then
    over = redis.call('HINCRBY', K_FAILS, item, 1) > max_retries
  elseif mode == 'lost' then
    over = redis.call('HINCRBY', K_LOST, item, 1) > max_lost
  end
  if retryable and not over then
    requeue(item, state, depth, front)
    return 'retry'
  end
  give_up(item, state, depth, reason)
  return 'dead'
end
