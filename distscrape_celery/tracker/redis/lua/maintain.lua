-- maintain: reclaim items whose deadline passed, then top up dispatch. Any live worker runs it on
-- its heartbeat, so recovery needs no singleton process.
-- An expired lease (scraping or saving) or an expired save-pending item means the worker holding
-- it vanished or its save message was lost: that counts against max_lost, not max_retries (it is
-- not the item's fault), yet a page that kills every worker that takes it still ends dead. An
-- expired dispatch (the message was lost, its worker died before starting it, or it waited in a
-- backlog for longer than a lease) counts nothing; it is requeued, and counted apart.
-- KEYS: the item keys (see _lib_call.lua)
-- ARGV[1] bound, ARGV[2] max_batch, ARGV[3] lease   dispatch top-up, as in add.lua
-- ARGV[4] max_reclaim   most items reclaimed per in-flight set per call
-- ARGV[5] max_lost      as in retry_or_dead
-- ARGV[6] poll          wake at most this many seconds from now while items are dispatched or
--                       leased (their failures may start backoffs that end before the next
--                       heartbeat)
-- A job whose time budget ran out (max_duration, see out_of_time) dispatches nothing more; once
-- nothing of it is in flight (dispatched, leased, save pending), the call that sees it records
-- it expired, its queued and delayed items left where they are.
-- Returns {reclaimed, dead, wake, ended, requeued, dispatch_item...}; reclaimed counts leases
-- and save-pending items that expired, requeued the dispatched items whose message did not start
-- within a lease; ended is 'finished' for the one call that found the running job with nothing
-- left to do (it is then recorded finished), 'expired' for the one that recorded it expired, else
-- ''; wake (a string, seconds; '' for none) is when a domain's turn or a backoff ends while the
-- broker has room: a dispatch then hands out more.
local bound, max_batch, lease = ARGV[1], tonumber(ARGV[2]), micros(ARGV[3])
local max_reclaim, max_lost, poll = tonumber(ARGV[4]), tonumber(ARGV[5]), micros(ARGV[6])
local now = redis_now()
local reclaimed, died, requeued = 0, 0, 0

local function reclaim(zset, expected, mode, why)
  local retried = 0
  for _, item in ipairs(redis_call('ZRANGEBYSCORE', zset, '-inf', now, 'LIMIT', 0, max_reclaim)) do
    local v = live_get(item)
    local state, depth = nil, nil
    if v then state, depth = split_state(v) end
    if state and string.find(expected, state, 1, true) then
      local was = holder(item) or '?'
      if retry_or_dead(item, state, depth, mode, true, 0, max_lost,
          why .. ' too often (last holder ' .. was .. ')', true, 0) == 'retry' then
        retried = retried + 1
      else
        died = died + 1
      end
    else
      redis_call('ZREM', zset, item)  -- an entry left behind by a state change
    end
  end
  return retried
end

reclaimed, died = reclaim_saving(now, max_reclaim, max_lost, lease)
reclaimed = reclaimed + reclaim(K_LEASED, 'l', 'lost', 'its worker vanished')
reclaimed = reclaimed + reclaim(K_PENDING, 's', 'lost', 'its save message was lost')
requeued = reclaim(K_DISPATCHED, 'd', 'free', '')
-- A new generation's refill goes on a slice per call (a larger one than reclaims: it only
-- queues), and the caller is woken soon for the next.
local refilling = refill(5 * max_reclaim)
-- Completion, detected once: only the call that sees a running job with nothing left ends it.
-- A job's first generation has work once its first items come; a later one from its start.
-- So is the end of a job out of time, once what it had in flight came back.
local ended = ''
local state = job_state()
if state == 'running' and not refilling
    and (tonumber(redis_call('HGET', K_STATS, 'seen') or '0') > 0
      or redis_call('HEXISTS', K_CONTROL, 'generation') == 1)
    and tonumber(redis_call('HGET', K_STATS, 'queued') or '0') == 0
    and redis_call('ZCARD', K_DISPATCHED) + redis_call('ZCARD', K_LEASED)
      + redis_call('ZCARD', K_PENDING) + redis_call('ZCARD', K_DELAYED) == 0 then
  record_end('finished')
  ended = 'finished'
elseif (state == 'running' or state == 'paused') and out_of_time()
    and tonumber(redis_call('HGET', K_STATS, 'seen') or '0') > 0
    and redis_call('ZCARD', K_DISPATCHED) + redis_call('ZCARD', K_LEASED)
      + redis_call('ZCARD', K_PENDING) == 0 then
  record_end('expired')
  ended = 'expired'
end
local out = {reclaimed, died, '', ended, requeued}
take_for_dispatch(bound, max_batch, now + lease, out)
local wake = nil
-- Out of time, no turn of a domain brings a dispatch.
if not out_of_time() and dispatch_room(bound) > 0 then
  for _, zset in ipairs({K_DOMAINS, K_DELAYED}) do
    local first = redis_call('ZRANGE', zset, 0, 0, 'WITHSCORES')
    if first[2] and (not wake or tonumber(first[2]) < wake) then wake = tonumber(first[2]) end
  end
end
-- With items in flight, look again soon even while the broker is full: a failure may start a
-- short backoff after the room it frees was filled by the call that freed it.
local fetching = redis_call('ZCARD', K_LEASED) + redis_call('ZCARD', K_DISPATCHED) > 0
if fetching and (not wake or now + poll < wake) then wake = now + poll end
if refilling then wake = now end
if wake then out[3] = str_format('%.3f', math.max(wake - now, 0) / 1000000) end
return out
