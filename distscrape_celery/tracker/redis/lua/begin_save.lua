-- begin_save: a worker starts the save task of an item. With the current token the item becomes
-- 'saving' under a lease. Finding it 'saving' already under the same token means the previous run
-- of this save task vanished with its process (killed by the OOM killer, a crashing saver): that
-- counts against max_lost, so a save that always kills its worker ends dead instead of looping;
-- the dead run's lease must have expired first (a live one means a duplicate delivery).
-- A stale token changes nothing: the caller may still save (a late save completes the item).
-- The staged body is not read here: the caller reads it with a GET after this call, in the same
-- round trip (a body that went through Lua would be copied and hashed byte by byte, twice).
-- KEYS: the item keys (see _lib_call.lua)
-- ARGV[1] item
-- ARGV[2] token      the fencing token the save message carries
-- ARGV[3] worker     id of the saving worker
-- ARGV[4] lease      lease length in seconds
-- ARGV[5] max_lost   as in retry_or_dead
-- ARGV[6] bound, ARGV[7] max_batch   dispatch top-up, as in add.lua (a pending save left the broker)
-- Returns {status, lost, created, dispatch_item...}; status is ok|busy|stale|done|dead|unknown;
-- lost is the item's count of vanished holders; busy: a run of this save holds a live lease;
-- with ok and stale the caller saves the staged body (whoever saves); created is the job's
-- creation (_lib_call.lua).
local item, token, worker = ARGV[1], ARGV[2], ARGV[3]
local lease, max_lost = micros(ARGV[4]), tonumber(ARGV[5])
local bound, max_batch = ARGV[6], tonumber(ARGV[7])
local v = item_value(item)
if not v then return {'unknown', 0, job_created} end
local state, depth = split_state(v)
local lost = lost_of(item)
if state == 'D' then return {'done', lost, job_created} end
if state == 'X' then return {'dead', lost, job_created} end
local owner, held = holder(item)
if held ~= token or (state ~= 's' and state ~= 'S' and state ~= 'l') then
  return {'stale', lost, job_created}
end
local now = redis_now()
if state == 'S' then
  -- A run of this save is under a live lease: this is a duplicate delivery (the broker restored
  -- the message after a connection loss, say), not a redelivery after a death. Come back later.
  if tonumber(redis_call('ZSCORE', K_LEASED, item) or '0') > now then
    return {'busy', lost, job_created}
  end
  lost = add_lost(item)
  if lost > max_lost then
    give_up(item, state, depth, 'its save was interrupted ' .. lost .. ' times: the worker ' ..
      'process died while saving it (out of memory, or a crashing saver?)')
    return {'dead', lost, job_created}
  end
end
redis_call('ZREM', K_PENDING, item)
if state == 'l' then
  local domain = domain_of(item)
  sites.stop(item, domain)
  vacate(domain)
end
redis_call('ZADD', K_LEASED, int_text(now + lease), item)
-- Often its owner entry already names the worker (it took the save message over at reserve).
if owner ~= worker then redis_call('HSET', K_OWNERS, item, worker .. ' ' .. token) end
live_set(item, 'S', depth)
local out = {'ok', lost, job_created}
return take_for_dispatch(bound, max_batch, now + lease, out)
