-- extend: a live worker's heartbeat for the items it holds. Deadlines of items it is scraping or
-- saving right now move to a lease from now, but only for the worker that holds them, so a stale duplicate message
-- on another worker cannot keep a vanished worker's item from being reclaimed; deadlines of
-- dispatched items whose scrape message it has reserved move later. A save message it has
-- reserved takes its item out of the broker's hands into the worker's: the first time, the
-- item's deadline becomes a lease from now (kept by this heartbeat), so if this worker vanishes
-- the item is reclaimed in a lease rather than a save timeout; after that (and for a save this
-- worker deferred itself, which waits out its retry delay) the deadline only moves later.
-- Items not in flight any more are left alone.
-- KEYS: the item keys (see _lib_call.lua)
-- ARGV[1] lease    seconds
-- ARGV[2] worker   the calling worker
-- ARGV[3] n        reserved: how many reserved items follow (scrape and save messages it holds)
-- ARGV[4..3+n]     those items
-- ARGV[4+n] m      running: how many running items follow (tasks it is running now)
-- ARGV[5+n..4+n+m] those items
-- ARGV[5+n+m..]    pairs item, token: save messages reserved
-- Returns the number of items extended
local now = redis_now()
local deadline, worker, reserved = int_text(now + micros(ARGV[1])), ARGV[2], tonumber(ARGV[3])
local running = tonumber(ARGV[4 + reserved])
local extended = 0
for i = 4, 3 + reserved do
  extended = extended + redis_call('ZADD', K_DISPATCHED, 'XX', 'GT', 'CH', deadline, ARGV[i])
end
-- Only a running task keeps a lease: a reserved duplicate of it must not.
for i = 5 + reserved, 4 + reserved + running do
  if holder(ARGV[i]) == worker then
    extended = extended + redis_call('ZADD', K_LEASED, 'XX', 'GT', 'CH', deadline, ARGV[i])
    -- Its place under its site's cap, if it is being fetched (see sites.stop).
    local _, _, site = limits(domain_of(ARGV[i]))
    redis_call('ZADD', sites.fetches(job_name, site), 'XX', 'GT', deadline, ARGV[i])
  end
end
for i = 5 + reserved + running, #ARGV - 1, 2 do
  local item, token = ARGV[i], ARGV[i + 1]
  local v = live_get(item)
  local owner, held = holder(item)
  if v and str_sub(v, 1, 1) == 's' and held == token then
    if owner == worker then
      redis_call('ZADD', K_PENDING, 'XX', 'GT', deadline, item)
    else
      redis_call('ZADD', K_PENDING, deadline, item)
      redis_call('HSET', K_OWNERS, item, worker .. ' ' .. token)
    end
    extended = extended + 1
  end
end
return extended
