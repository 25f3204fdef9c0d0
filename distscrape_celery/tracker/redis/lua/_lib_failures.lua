-- The item scripts' library, part 8 of 10 (scripts.LIBRARY): an item leaving flight (queued again,
-- delayed, done or dead), its failure counts, and the one retry-or-dead rule.

-- The deadline set that holds an item in each state (a live item's name is kept only where its
-- state puts it, see KEYS[1] in _lib_call.lua), and the states whose items have a holder in owners.
local HELD = {l = true, s = true, S = true}

-- Take `item` (in `state`) out of the in-flight or delayed set its state puts it in, and forget
-- its holder. Only that set: a miss in the others would still search them.
local function clear_inflight(item, state)
  local set = STATE_SET[state]
  if set then redis_call('ZREM', set, item) end
  if HELD[state] then redis_call('HDEL', K_OWNERS, item) end
  if state == 'd' or state == 'l' then
    local domain = domain_of(item)
    if state == 'l' then sites.stop(item, domain) end
    vacate(domain)
  end
end

-- Leave whatever state `item` is in (`state`) for its domain's queue: at its head when `front`.
local function requeue(item, state, depth, front)
  if state == 'q' then return end
  clear_inflight(item, state)
  live_set(item, 'q', depth)
  count('queued', 1)
  enqueue(item, front, depth)
end

-- Leave whatever state `item` is in for the delayed set, until `due` (Redis time).
local function delay_until(item, state, depth, due)
  if state == 'q' then count('queued', -1) end
  clear_inflight(item, state)
  live_set(item, 'w', depth)
  redis_call('ZADD', K_DELAYED, int_text(due), item)
end

-- Whether the job's fails and lost hashes (items' failed attempts and vanished holders) are
-- empty, read once a call and kept true by every write through the functions below: most items
-- never fail, and each page's steps would otherwise read and clear both for nothing. nil: not
-- read yet in this call.
local fails_empty, lost_empty

local function no_fails()
  if fails_empty == nil then fails_empty = redis_call('EXISTS', K_FAILS) == 0 end
  return fails_empty
end

local function none_lost()
  if lost_empty == nil then lost_empty = redis_call('EXISTS', K_LOST) == 0 end
  return lost_empty
end

-- The failed attempts of `item` that were its fault.
local function fails_of(item)
  if no_fails() then return 0 end
  return tonumber(redis_call('HGET', K_FAILS, item) or '0')
end

-- How many times a holder of `item` vanished.
local function lost_of(item)
  if none_lost() then return 0 end
  return tonumber(redis_call('HGET', K_LOST, item) or '0')
end

-- One more failed attempt of `item`, or vanished holder; the new count.
local function add_fail(item)
  fails_empty = false
  return redis_call('HINCRBY', K_FAILS, item, '1')
end

local function add_lost(item)
  lost_empty = false
  return redis_call('HINCRBY', K_LOST, item, '1')
end

-- `item` starts afresh: its failed attempts and vanished holders are forgotten.
local function forget_failures(item)
  if not no_fails() then redis_call('HDEL', K_FAILS, item) end
  if not none_lost() then redis_call('HDEL', K_LOST, item) end
end

-- `item` (in `state`) is done: it leaves every per-item key and lives on only in the seen set
-- (so it is never added again in this generation), or with `record` among the known items (so
-- a later generation fetches it again when it is due); `done` counts it.
local function finish(item, state, record)
  if state == 'q' then count('queued', -1) end
  clear_inflight(item, state)
  live_del(item)
  forget_failures(item)
  if record then remember_known(item, record) else remember_done(item) end
  count('done', 1)
end

-- Give up on `item` for good, keeping `reason`.
local function give_up(item, state, depth, reason)
  if state == 'q' then count('queued', -1) end
  clear_inflight(item, state)
  live_set(item, 'X', depth)
  redis_call('HSET', K_DEAD, item, reason)
  count('dead', 1)
end

-- The one retry-or-dead rule. `mode` says whose fault the attempt was:
--   'item'  its download or save raised: counts against max_retries
--   'lost'  the worker holding it vanished (killed, hung, cut off): counts against max_lost
--   'free'  neither (a hand-back, e.g. the broker refused the save): counts nothing
-- A retry waits `delay` seconds in the delayed set first, if that is more than 0.
-- Returns 'retry' or 'dead'.
local function retry_or_dead(item, state, depth, mode, retryable, max_retries, max_lost, reason,
                             front, delay)
  local over = false
  if mode == 'item' then
    over = add_fail(item) > max_retries
  elseif mode == 'lost' then
    over = add_lost(item) > max_lost
  end
  if retryable and not over then
    if delay and delay > 0 then
      delay_until(item, state, depth, redis_now() + micros(delay))
    else
      requeue(item, state, depth, front)
    end
    return 'retry'
  end
  give_up(item, state, depth, reason)
  return 'dead'
end

-- maintain's reclaim of expired saving leases (at most `max_reclaim`, deadlines before `now`):
-- the process saving each died (or hung). When only a pool process died, Celery sends its save
-- message again at once (task_reject_on_worker_lost) and the body is still staged: the item waits
-- one more lease for that message, counting a vanished holder, instead of being downloaded again.
-- If the whole worker died, its message is stuck until the broker's visibility timeout, so after
-- that lease the item is reclaimed like any other. Returns how many wait again, and how many died.
local function reclaim_saving(now, max_reclaim, max_lost, lease)
  local reclaimed, died = 0, 0
  local expired = redis_call('ZRANGEBYSCORE', K_LEASED, '-inf', now, 'LIMIT', 0, max_reclaim)
  for _, item in ipairs(expired) do
    local v = live_get(item)
    if v and str_sub(v, 1, 1) == 'S' then
      local _, depth = split_state(v)
      local was, token = holder(item)
      local lost = add_lost(item)
      if lost > max_lost then
        give_up(item, 'S', depth, 'its save was interrupted too often (last holder ' .. was .. ')')
        died = died + 1
      else
        redis_call('ZREM', K_LEASED, item)
        redis_call('ZADD', K_PENDING, int_text(now + lease), item)
        redis_call('HSET', K_OWNERS, item, '- ' .. token)
        live_set(item, 's', depth)
        reclaimed = reclaimed + 1
      end
    end
  end
  return reclaimed, died
end
