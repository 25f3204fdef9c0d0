-- defer_save: the saver cannot store anything right now (disk full, output unreachable), which
-- is not the item's fault: keep it save-pending, body and all, for another save_timeout, counting
-- nothing. The caller publishes the save again later.
-- KEYS: the item keys (see _lib_call.lua)
-- ARGV[1] item, ARGV[2] token, ARGV[3] save_timeout
-- Returns 1 if deferred, 0 if the caller is not the holder (stale) or the item moved on
local item, token, save_timeout = ARGV[1], ARGV[2], micros(ARGV[3])
local v = live_get(item)
if not v then return 0 end
local state, depth = split_state(v)
local _, held = holder(item)
if held ~= token or state ~= 'S' then return 0 end
redis_call('ZREM', K_LEASED, item)
redis_call('ZADD', K_PENDING, redis_now() + save_timeout, item)
live_set(item, 's', depth)
return 1
