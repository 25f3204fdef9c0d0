-- The item scripts' library, part 4 of 10 (scripts.LIBRARY): fingerprints, the bucketed sets that
-- keep them (linear hashing), and the seen set of done items.

-- -- fingerprints -----------------------------------------------------------------------------
-- Every item the job holds is known by its fingerprint: 63 bits of the SHA-1 of the item, written
-- as a decimal integer, so that Redis stores it as a 64-bit integer (in an intset or a listpack)
-- rather than as text. A live item is a field of a live-item bucket; a done item a member of a
-- seen-set bucket. Two items with one fingerprint are one item to the job: the second is never
-- fetched (about n / 8.6e18 for each new item when n are known).
local TWO_33 = 8589934592

-- The fingerprint of `item` (a decimal string: a * 10^9 + b, a < 2^33, b < 10^9, so it fits an
-- int64) and its high part a. Lua numbers are doubles (exact to 2^53), so the two parts are kept
-- apart and joined as text; no leading zero.
local function fingerprint(item)
  local text = fingerprint_cache[item]
  if text then return text, fingerprint_high_cache[item] end
  text = old_fingerprint_cache[item]
  if text then
    local high = old_fingerprint_high_cache[item]
    make_cache_room()
    fingerprint_cache[item], fingerprint_high_cache[item] = text, high
    return text, high
  end
  local digest = redis.sha1hex(item)
  local high = tonumber(str_sub(digest, 1, 9), 16) % TWO_33
  local low = tonumber(str_sub(digest, 10, 17), 16) % 1000000000
  -- %d (a C long, 64 bits here) is exact for a < 2^33 and cheaper than %.0f.
  if high == 0 then text = str_format('%d', low) else text = str_format('%d%09d', high, low) end
  if caching_items then
    make_cache_room()
    fingerprint_cache[item], fingerprint_high_cache[item] = text, high
  end
  return text, high
end

-- The high part a of a stored fingerprint (all but its last 9 digits).
local function fingerprint_high(member)
  if #member <= 9 then return 0 end
  return tonumber(str_sub(member, 1, #member - 9))
end

-- Buckets grow with their set by linear hashing, so a small job has a few keys and every bucket
-- stays small enough for Redis's compact encodings: the buckets are 0 .. 2^level + split - 1; a
-- fingerprint whose high part is a goes to a mod 2^level, or to a mod 2^(level+1) if that is
-- below the split pointer. When the set holds more than `fill` per bucket, bucket `split` is
-- split in two (its members with bit `level` of a set move to bucket split + 2^level). A bucket
-- not yet split in a round reaches about 2 * fill. A table describes one bucketed set.
local function bucketed(prefix, level_field, split_field)
  return {prefix = prefix, level_field = level_field, split_field = split_field, keys = {}}
end

local function set_geometry(set, level, split)
  set.level, set.split, set.span = level, split, 2 ^ level
end

local function bucket_key(set, n)
  local k = set.keys[n]
  if not k then
    k = set.prefix .. str_format('%.0f', n)
    set.keys[n] = k
  end
  return k
end

local function bucket_of(set, a)
  local n = a % set.span
  if n < set.split then n = a % (2 * set.span) end
  return bucket_key(set, n)
end

-- Split bucket set.split in two: `rehash(from, to, moves)` moves to the new bucket `to` the
-- members of `from` for which moves(member) is true (those whose a has bit set.level set).
local function split_bucket(set, rehash)
  local span, split = set.span, set.split
  rehash(bucket_key(set, split), bucket_key(set, split + span), function(m)
    return fingerprint_high(m) % (2 * span) ~= split
  end)
  local level = set.level
  split = split + 1
  if split == span then level, split = level + 1, 0 end
  set_geometry(set, level, split)
  redis_call('HSET', K_STATS, set.level_field, level, set.split_field, split)
end

-- Call `command` on `key` with the values of `list` (flat) a slice at a time, so unpack stays far
-- from Lua's stack limit however long the list is; `step` values a slice (even for pairs).
local function in_slices(command, key, list, step)
  for i = 1, #list, step do
    redis_call(command, key, unpack(list, i, math.min(i + step - 1, #list)))
  end
end

-- -- the seen set ----------------------------------------------------------------------------
-- Done items, by fingerprint only: each bucket is a set that Redis keeps as an intset (8 bytes a
-- member, while a bucket holds at most set-max-intset-entries, 512 by default). A fingerprint is
-- written when its item is done. Level and split pointer: stats STAT.seen_level and
-- STAT.seen_split; size: STAT.seen_size.
local SEEN_FILL = 160

-- The geometry of the bucketed sets (seen, live, known) and the sizes of seen and known, read
-- in one HMGET once a call (an item is looked up in several, or finished from one to another).
local function bucket_geometry()
  if not seen.count then
    local geometry = redis_call('HMGET', K_STATS, STAT.seen_level, STAT.seen_split,
      STAT.seen_size, STAT.live_level, STAT.live_split, STAT.known_level, STAT.known_split,
      STAT.known_size)
    set_geometry(seen, tonumber(geometry[1] or '0'), tonumber(geometry[2] or '0'))
    seen.count = tonumber(geometry[3] or '0')
    set_geometry(live, tonumber(geometry[4] or '0'), tonumber(geometry[5] or '0'))
    set_geometry(known, tonumber(geometry[6] or '0'), tonumber(geometry[7] or '0'))
    known.count = tonumber(geometry[8] or '0')
  end
end

local function seen_rehash(from, to, moves)
  local moving = {}
  for _, m in ipairs(redis_call('SMEMBERS', from)) do
    if moves(m) then moving[#moving + 1] = m end
  end
  in_slices('SREM', from, moving, 256)
  in_slices('SADD', to, moving, 256)
end

-- Record done `item` in the seen set (it has just left the live items).
local function remember_done(item)
  bucket_geometry()
  local fp, high = fingerprint(item)
  if redis_call('SADD', bucket_of(seen, high), fp) == 0 then return end  -- a twin's fingerprint
  seen.count = seen.count + 1
  count(STAT.seen_size, 1)
  -- a has 33 bits: past 2^33 buckets (far beyond any job) the buckets just fill up.
  if seen.count > SEEN_FILL * (seen.span + seen.split) and seen.level < 33 then
    split_bucket(seen, seen_rehash)
  end
end

-- Whether `item`, not live, is done (or a done item's fingerprint twin).
local function is_done(item)
  bucket_geometry()
  if seen.count == 0 then return false end
  local fp, a = fingerprint(item)
  return redis_call('SISMEMBER', bucket_of(seen, a), fp) == 1
end

