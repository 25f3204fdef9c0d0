-- handoff: a worker queued the save messages of items it kept after scraping them (scraped.lua's
-- keeper): each now waits for its message in the broker's hands, for up to save_timeout, with no
-- holder. An item that is no longer the caller's under that token (its save already began, a
-- worker that reserved the message took it, or it was reclaimed) is left alone.
-- KEYS: the item keys (see _lib_call.lua)
-- ARGV[1] worker         the calling worker
-- ARGV[2] save_timeout   seconds
-- ARGV[3..]              pairs item, token
-- Returns the number of items handed over
local worker, save_timeout = ARGV[1], micros(ARGV[2])
local later = redis_now() + save_timeout
local handed = 0
for i = 3, #ARGV - 1, 2 do
  local item, token = ARGV[i], ARGV[i + 1]
  local v = live_get(item)
  local owner, held = holder(item)
  if v and str_sub(v, 1, 1) == 's' and owner == worker and held == token then
    redis_call('ZADD', K_PENDING, int_text(later), item)
    redis_call('HSET', K_OWNERS, item, '- ' .. token)
    handed = handed + 1
  end
end
return handed
