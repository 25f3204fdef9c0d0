-- expire_saves: the save messages of these items are in no broker queue and no worker has taken
-- them over: they left the broker with a worker that died before it could (ack emulation off).
-- Their pending deadline becomes now, so the next maintain reclaims them (a vanished holder)
-- instead of after the save timeout. An item taken over meanwhile, or saved, is left alone.
-- KEYS: the item keys (see _lib_call.lua)
-- ARGV[1..]   pairs item, token
-- Returns the number of items expired
local now = redis_now()
local expired = 0
for i = 1, #ARGV - 1, 2 do
  local item, token = ARGV[i], ARGV[i + 1]
  local v = live_get(item)
  local owner, held = holder(item)
  if v and str_sub(v, 1, 1) == 's' and owner == '-' and held == token then
    redis_call('ZADD', K_PENDING, now, item)
    expired = expired + 1
  end
end
return expired
