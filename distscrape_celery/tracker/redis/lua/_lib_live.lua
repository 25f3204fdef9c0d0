-- The item scripts' library, part 6 of 10 (scripts.LIBRARY): the live items, each one's state and
-- depth by its fingerprint.

-- -- live items -------------------------------------------------------------------------------
-- Every item added and not done, by fingerprint: each bucket is a hash fingerprint -> state and
-- depth packed in one integer, depth * 8 + the state's code, which Redis keeps as a listpack
-- (about 12 bytes a field: the fingerprint as an int64, the value as a small integer) while a
-- bucket holds at most hash-max-listpack-entries fields (128 by default). LIVE_FILL keeps a
-- bucket not yet split in a round near 2 * 36 = 72, far from 128 at any size. The item's name is
-- kept where its state puts it (KEYS[1] in _lib_call.lua), so a queued item's name is stored once,
-- in its domain's queue. Level and split pointer: stats STAT.live_level and STAT.live_split;
-- size: seen - done.
local LIVE_FILL = 36
-- The states' letters and codes: ItemState and ItemState.code in tracker/model.py.
local CODE = {q = 0, w = 1, d = 2, l = 3, s = 4, S = 5, X = 6}
local LETTER = {[0] = 'q', 'w', 'd', 'l', 's', 'S', 'X'}

-- The packed value of `state` (a letter) at `depth` (a decimal string or a number).
local function pack(state, depth)
  return int_text(tonumber(depth) * 8 + CODE[state])
end

-- `item`'s bucket key and fingerprint.
local function live_slot(item)
  bucket_geometry()
  local fp, a = fingerprint(item)
  return bucket_of(live, a), fp
end

-- A packed value's state letter and depth as one string ('q0'), by the value's text: kept across
-- calls (a function of the text alone), up to SMALL_TEXTS of them.
local state_texts, state_text_count = {}, 0

-- The state letter and depth of live `item`, as one string ('q0'); nil if it is not live.
local function live_get(item)
  local key, fp = live_slot(item)
  local packed = redis_call('HGET', key, fp)
  if not packed then return nil end
  local text = state_texts[packed]
  if text then return text end
  local number = tonumber(packed)
  local code = number % 8
  text = LETTER[code] .. int_text((number - code) / 8)
  if state_text_count >= SMALL_TEXTS then state_texts, state_text_count = {}, 0 end
  state_texts[packed], state_text_count = text, state_text_count + 1
  return text
end

-- Live `item` (already live: add_items makes items live) is now in `state` at `depth`.
local function live_set(item, state, depth)
  local key, fp = live_slot(item)
  redis_call('HSET', key, fp, pack(state, depth))
end

-- `item` is no longer live (it is done).
local function live_del(item)
  local key, fp = live_slot(item)
  redis_call('HDEL', key, fp)
end

-- A small listpack is cheaper to write anew than to delete half its fields from one by one (each
-- HDEL searches it): the bucket is read whole, dropped, and both halves written.
local function live_rehash(from, to, moves)
  local keep, moving = {}, {}
  local all = redis_call('HGETALL', from)
  for i = 1, #all, 2 do
    local half = keep
    if moves(all[i]) then half = moving end
    half[#half + 1] = all[i]
    half[#half + 1] = all[i + 1]
  end
  redis_call('DEL', from)
  in_slices('HSET', from, keep, 256)
  in_slices('HSET', to, moving, 256)
end

-- The live items grew: split buckets until they hold at most LIVE_FILL each on average (in a
-- batch, once, at its end).
local function grow_live()
  if counts_deferred then
    grow_deferred = true
    return
  end
  bucket_geometry()
  local c = counters('seen', 'done')
  local n = c[1] - c[2]
  while n > LIVE_FILL * (live.span + live.split) and live.level < 33 do
    split_bucket(live, live_rehash)
  end
end

-- The state of `item`: its state letter and depth if live, 'D0' if done (in the seen set or
-- known: its depth is not looked up), nil if never added (or taken for a fingerprint
-- collision's twin).
local function item_value(item)
  local v = live_get(item)
  if v then return v end
  if is_finished(item) then return 'D0' end
  return nil
end

