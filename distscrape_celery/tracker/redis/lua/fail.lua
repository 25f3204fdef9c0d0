-- fail: the holder of an item reports a failed attempt; queue the item again or, past its retries,
-- make it dead with the reason. A retry with a delay (backoff, Retry-After) waits in the delayed set
-- on Redis's clock, never in a broker countdown. Only the current holder (same fencing token)
-- changes anything: a worker whose lease already expired cannot touch a live lease or a finished
-- item.
-- KEYS: the item keys (see _lib_call.lua)
-- ARGV[1] item
-- ARGV[2] token
-- ARGV[3] reason
-- ARGV[4] mode          item|lost|free, as in retry_or_dead
-- ARGV[5] retryable     1: may be tried again; 0: dead at once
-- ARGV[6] max_retries, ARGV[7] max_lost
-- ARGV[8] bound, ARGV[9] max_batch, ARGV[10] lease   dispatch top-up, as in add.lua
-- ARGV[11] delay        seconds a retry waits before it is queued again (0: queued at once)
-- Returns {outcome, dispatch_item...}; outcome is retry|dead|ignored
local item, token, reason, mode = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local retryable, max_retries, max_lost = ARGV[5] == '1', tonumber(ARGV[6]), tonumber(ARGV[7])
local bound, max_batch, lease = ARGV[8], tonumber(ARGV[9]), micros(ARGV[10])
local delay = tonumber(ARGV[11])
local outcome = 'ignored'
local v = live_get(item)
if v then
  local state, depth = split_state(v)
  local _, held = holder(item)
  if held == token and (state == 'l' or state == 's' or state == 'S') then
    outcome = retry_or_dead(item, state, depth, mode, retryable, max_retries, max_lost, reason, false,
      delay)
  end
end
local out = {outcome}
return take_for_dispatch(bound, max_batch, redis_now() + lease, out)
