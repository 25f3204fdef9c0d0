-- release: put in-flight items back in their domains' queues at once, counting nothing: those held by a
-- worker that is stopping (ARGV[1] = its id), or every in-flight item of the job (ARGV[1] = '';
-- only safe when no worker runs the job, e.g. when a stopped one-machine crawl resumes).
-- A stopping worker's save-pending items are of two kinds. Those whose save messages it had
-- reserved (the pairs given) go back to the broker with those messages (late acknowledgement):
-- they wait for them again, for a save timeout, with no holder. The others it kept for a save
-- batch it had not queued yet (scraped.lua's keeper): no message exists for them, so they are
-- queued again at once; if one did go out just before, its save finds its token stale and the
-- page is downloaded twice, never lost.
-- Every dispatched item of the job is queued again too: the stopping worker's processes may have
-- taken some for scrape messages they never sent (carried with a save batch), and dispatched
-- items name no worker. They are few (the dispatch bound); one whose message is out gets a
-- second message, and whichever comes second finds it taken and does nothing.
-- KEYS: the item keys (see _lib_call.lua)
-- ARGV[1] worker         id, or '' for all
-- ARGV[2] save_timeout   seconds
-- ARGV[3..]              pairs item, token: the save messages the worker had reserved
-- Returns the number of items released
local worker, save_timeout = ARGV[1], micros(ARGV[2])
local released = 0
if worker ~= '' then
  local returning = {}
  for i = 3, #ARGV - 1, 2 do returning[ARGV[i]] = ARGV[i + 1] end
  local later = redis_now() + save_timeout
  for _, item in ipairs(redis_call('ZRANGE', K_PENDING, 0, -1)) do
    local owner, token = holder(item)
    if owner == worker then
      if returning[item] == token then
        redis_call('ZADD', K_PENDING, later, item)
        redis_call('HSET', K_OWNERS, item, '- ' .. token)
      else  -- a pending item always has its state: 's' .. depth
        local _, depth = split_state(live_get(item))
        requeue(item, 's', depth, true)
        released = released + 1
      end
    end
  end
end
local sets = {K_LEASED, K_DISPATCHED}
if worker == '' then sets = {K_LEASED, K_PENDING, K_DISPATCHED} end
for _, set in ipairs(sets) do
  for _, item in ipairs(redis_call('ZRANGE', set, 0, -1)) do
    local v = live_get(item)
    if v then
      local state, depth = split_state(v)
      if state ~= 'X' and state ~= 'q'
          and (worker == '' or state == 'd' or holder(item) == worker) then
        requeue(item, state, depth, true)
        released = released + 1
      end
    end
  end
end
return released
