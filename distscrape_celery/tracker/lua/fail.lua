-- fail: record a failed attempt; queue the item again or, past its retries, make it dead with the
-- reason. A failed item is never counted as done.
-- KEYS: the item keys (see _lib.lua)
-- ARGV[1] item
-- ARGV[2] reason
-- ARGV[3] retryable     1: may be tried again; 0: dead at once
-- ARGV[4] max_retries   failed attempts allowed before the item is dead
-- ARGV[5] count         1: this attempt counts against max_retries; 0: requeue for free
-- ARGV[6] bound, ARGV[7] max_batch, ARGV[8] lease   dispatch top-up, as in add.lua
-- Returns {outcome, dispatch_item...}; outcome is retry|dead|ignored (unknown, done or dead item)
local item, reason = ARGV[1], ARGV[2]
local retryable, max_retries, count = ARGV[3] == '1', tonumber(ARGV[4]), ARGV[5] == '1'
local bound, max_batch, lease = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local outcome = 'ignored'
local v = redis.call('HGET', K_ITEMS, item)
if v then
  local state, depth = split_state(v)
  if state ~= 'D' and state ~= 'X' then
    local fails
    if count then
      fails = redis.call('HINCRBY', K_FAILS, item, 1)
    else
      fails = tonumber(redis.call('HGET', K_FAILS, item) or '0')
    end
    if state == 'q' then redis.call('HINCRBY', K_STATS, 'queued', -1) end
    clear_inflight(item)
    if retryable and fails <= max_retries then
      redis.call('HSET', K_ITEMS, item, 'q' .. depth)
      redis.call('RPUSH', K_FRONTIER, item)
      redis.call('HINCRBY', K_STATS, 'queued', 1)
      outcome = 'retry'
    else
      redis.call('HSET', K_ITEMS, item, 'X' .. depth)
      redis.call('HSET', K_DEAD, item, reason)
      redis.call('HINCRBY', K_STATS, 'dead', 1)
      outcome = 'dead'
    end
  end
end
local out = {outcome}
return take_for_dispatch(bound, max_batch, redis_now() + lease, out)
