-- unclaimed_saves: save-pending items whose save message was handed to the broker (owner
-- "- <token>") at least `age` seconds ago and that no worker has taken over since. Each is either
-- still waiting in the broker's save queue or was taken by a worker that died before it could
-- take the items over (see expire_saves.lua).
-- KEYS: the item keys (see _lib_call.lua)
-- ARGV[1] age            seconds since the hand-over
-- ARGV[2] save_timeout   seconds (a hand-over's pending deadline is its time plus this)
-- ARGV[3] limit          most items returned
-- Returns item, token, item, token, ...
local age, save_timeout, limit = micros(ARGV[1]), micros(ARGV[2]), tonumber(ARGV[3])
local out = {}
local before = redis_now() + save_timeout - age
for _, item in ipairs(redis_call('ZRANGEBYSCORE', K_PENDING, '-inf', before, 'LIMIT', 0, limit)) do
  local v = live_get(item)
  local owner, token = holder(item)
  if v and str_sub(v, 1, 1) == 's' and owner == '-' then
    out[#out + 1] = item
    out[#out + 1] = token
  end
end
return out
