-- The item scripts' library, part 9 of 10 (scripts.LIBRARY): generations. A job that runs again
-- (on its schedule, or when asked) starts a new generation (generation.lua): the seen set is
-- emptied, the seeds are added again, and the refill below queues, a slice per call of maintain,
-- the items the last generation gave up on and the known items that are due.

-- The last generation's dead items wait here to be queued again (a hash like dead).
local function redo_key()
  return str_sub(K_DEAD, 1, -5) .. 'redo'
end

-- Known `item` (at `depth`) is due: it is live and queued again, unless it is live already.
local function queue_known(item, depth)
  local key, fp = live_slot(item)
  if redis_call('HSETNX', key, fp, pack('q', depth)) == 0 then return false end
  count('seen', 1)
  count('queued', 1)
  enqueue(item, false, depth)
  return true
end

-- One slice (about `budget` items) of the refill, if one is under way. Returns whether one
-- still is.
local function refill(budget)
  local cursor = redis_call('HGET', K_CONTROL, 'refill')
  if not cursor then return false end
  local looked, queued = 0, 0
  local redo = redo_key()
  -- The items the last generation gave up on are tried again, their failures forgotten.
  while looked < budget do
    local page = redis_call('HSCAN', redo, '0', 'COUNT', int_text(budget - looked))
    local entries = page[2]
    if #entries == 0 then break end
    for i = 1, #entries, 2 do
      local item = entries[i]
      redis_call('HDEL', redo, item)
      local v = live_get(item)
      if v and str_sub(v, 1, 1) == 'X' then
        forget_failures(item)
        count('dead', -1)
        requeue(item, 'X', str_sub(v, 2), false)
        queued = queued + 1
      end
      looked = looked + 1
    end
  end
  -- Then the known items that are due by the generation's start (records.due), a bucket at a
  -- time. A bucket
  -- split meanwhile moves items to a bucket past the cursor, or to one it passed whose items
  -- are queued already or were fetched in this generation (not due): none is missed or doubled.
  bucket_geometry()
  local n = tonumber(cursor)
  local started = math.floor(tonumber(redis_call('HGET', K_CONTROL, 'started') or '0'))
  while looked < budget and n < known.span + known.split do
    local bucket = bucket_key(known, n)
    for _, item in ipairs(redis_call('LRANGE', names_key(bucket), '0', '-1')) do
      local record = redis_call('HGET', bucket, (fingerprint(item)))
      if record and records.due(record) < started and queue_known(item, records.depth(record)) then
        queued = queued + 1
      end
      looked = looked + 1
    end
    n = n + 1
  end
  if queued > 0 then
    grow_live()
    reactivate()
  end
  if n >= known.span + known.split and redis_call('EXISTS', redo) == 0 then
    redis_call('HDEL', K_CONTROL, 'refill')
    return false
  end
  redis_call('HSET', K_CONTROL, 'refill', int_text(n))
  return true
end

-- Start generation `generation` of the job (of this shard), which is idle: its counters begin
-- again (the items given up on stay live, and so counted, until the refill queues them), the
-- seen set is emptied, and the refill is set to run. The caller adds the seeds.
local function begin_generation(generation, next_due)
  local now = redis_now()
  -- A generation starts in a later second than the one before (records.due counts in whole
  -- seconds from the start of the generation that fetched an item).
  local last = math.floor(tonumber(redis_call('HGET', K_CONTROL, 'started') or '0'))
  if now < (last + 1) * 1000000 then now = (last + 1) * 1000000 end
  redis_call('HSET', K_CONTROL, 'generation', int_text(generation),
    'started', str_format('%.6f', now / 1000000))
  redis_call('HDEL', K_CONTROL, 'ended')
  if next_due ~= '' then redis_call('HSET', K_CONTROL, 'next_due', next_due) end
  set_job_state('running')
  local dead = counters('dead')[1]
  redis_call('HSET', K_STATS, 'seen', int_text(dead), 'done', '0', 'queued', '0', 'links_cut', '0',
    'unchanged', '0', 'gone', '0', 'noindex', '0', 'canonical', '0')
  bucket_geometry()
  local last = seen.span + seen.split - 1
  for first = 0, last, 256 do
    local slice = {}
    for n = first, math.min(first + 255, last) do slice[#slice + 1] = bucket_key(seen, n) end
    redis_call('UNLINK', unpack(slice))
  end
  redis_call('HDEL', K_STATS, STAT.seen_size, STAT.seen_level, STAT.seen_split)
  set_geometry(seen, 0, 0)
  seen.count = 0
  redis_call('UNLINK', K_DSEEN)
  if dead > 0 then redis_call('RENAME', K_DEAD, redo_key()) end
  if dead > 0 or known.count > 0 then redis_call('HSET', K_CONTROL, 'refill', '0') end
  reactivate()
end
