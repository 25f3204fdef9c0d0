-- release: put in-flight items back in their domains' queues at once, counting nothing: those held by a
-- worker that is stopping (ARGV[1] = its id), or every in-flight item of the job (ARGV[1] = '';
-- only safe when no worker runs the job, e.g. when a stopped one-machine crawl resumes).
-- A stopping worker's reserved save messages go back to the broker (late acknowledgement), so
-- their items wait for them again for a save timeout instead.
-- KEYS: the item keys (see _lib.lua)
-- ARGV[1] worker         id, or '' for all
-- ARGV[2] save_timeout   seconds
-- Returns the number of items released
local worker, save_timeout = ARGV[1], tonumber(ARGV[2])
local n = 0
if worker ~= '' then
  local later = redis_now() + save_timeout
  for _, item in ipairs(redis.call('ZRANGE', K_PENDING, 0, -1)) do
    if holder(item) == worker then redis.call('ZADD', K_PENDING, later, item) end
  end
end
-- A stopping worker gives back what it works on; the save messages it published stay valid.
local sets = {K_LEASED}
if worker == '' then sets = {K_LEASED, K_PENDING, K_DISPATCHED} end
for _, set in ipairs(sets) do
  for _, item in ipairs(redis.call('ZRANGE', set, 0, -1)) do
    local v = redis.call('HGET', K_ITEMS, item)
    if v then
      local state, depth = split_state(v)
      if state ~= 'X' and state ~= 'q' and (worker == '' or holder(item) == worker) then
        requeue(item, state, depth, true)
        n = n + 1
      end
    end
  end
end
return n
