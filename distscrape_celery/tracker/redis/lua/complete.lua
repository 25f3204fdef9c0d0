-- complete: mark an item done after its body was saved. Idempotent, and open to any token: a save
-- that succeeded late, after the item was handed to another worker, still completes it (the
-- savers are idempotent, so the other worker's save leaves one copy).
-- KEYS: the item keys (see _lib_call.lua), then
-- KEYS[22] body   optional: the body staged for this save, dropped here (whatever the item's
--                 state: the save is over) to spare the saver a round trip
-- ARGV[1] item
-- ARGV[2] bound, ARGV[3] max_batch, ARGV[4] lease   dispatch top-up, as in add.lua
-- ARGV[5] revisit  '' (the job keeps no record of the item), or how its fetch went in a job that
--                  revisits: 'saved' (new or changed, and saved), 'unchanged' (not saved), 'gone'
--                  (a 404 or 410), each with ARGV[6]; or 'dropped' (gone for good: the item is
--                  known no more, and done for this generation only)
-- ARGV[6] record   the item's record (tracker/revisits.py) in hex, all but its due time, which
--                  follows from the generation's start and the record's interval
--                  (records.due_after in _lib_known.lua)
-- ARGV[7] carry   '1': the caller goes on with one more item itself, in the slot this completion
--                 frees: take_carried hands it one past the dispatch bound, first of the items
-- Returns {changed (1 or 0), dispatch_item...}
local item = ARGV[1]
local bound, max_batch, lease = ARGV[2], tonumber(ARGV[3]), micros(ARGV[4])
local revisit = ARGV[5] or ''
local changed = 0
if KEYS[22] then redis_call('UNLINK', KEYS[22]) end
local v = live_get(item)
if v then
  local state = split_state(v)
  if state ~= 'X' then
    local record = nil
    if revisit == 'dropped' then
      forget_known(item)
      count('gone', 1)
    elseif revisit ~= '' then
      local rest = records.from_hex(ARGV[6])
      local started = math.floor(tonumber(redis_call('HGET', K_CONTROL, 'started') or '0'))
      record = records.u32_bytes(records.due_after(started, records.interval(rest, 3))) .. rest
      if revisit ~= 'saved' then count(revisit, 1) end
    end
    finish(item, state, record)
    changed = 1
  end
end
local out = {changed}
if ARGV[7] == '1' then take_carried(bound, redis_now() + lease, out) end
return take_for_dispatch(bound, max_batch, redis_now() + lease, out)
