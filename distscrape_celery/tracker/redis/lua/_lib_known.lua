-- The item scripts' library, part 5 of 10 (scripts.LIBRARY): the known items of a job that
-- revisits, each with what fetching it again needs.

-- -- known items ------------------------------------------------------------------------------
-- A job with a revisit policy keeps its done items here instead of in the seen set: bucket n is
-- a hash `P k:<n>`, fingerprint -> the item's record, with the items' names in a list
-- `P u:<n>` (keys.py; the generation that revisits them reads the names from there; a record holds
-- no name, so it stays short enough for Redis's listpack encoding, whose values end at 64
-- bytes). A record is binary, written by the worker that saved the item (tracker/revisits.py
-- packs it) but for its first four bytes, when it is due again (Unix seconds, big-endian), which
-- complete computes from the generation's start; then a byte of depth. Level and split
-- pointer: stats STAT.known_level and STAT.known_split; size: STAT.known_size. A known item is
-- done for the
-- generation that fetched it and for every later one until it is due; it is queued again by the
-- generation it is due in (_lib_generation.lua). A bucket not yet split in a round holds about
-- 2 x 48: under hash-max-listpack-entries (128) by a margin, and the keys' own cost is spread
-- over more items than the live items' 36 (_lib_live.lua).

-- The call's bucketed sets (seen, live, known), their geometry to be read (bucket_geometry).
-- begin calls it: a Lua function has at most 60 upvalues, and begin sets nearly that many.
local function new_sets()
  seen = bucketed(K_SEEN, STAT.seen_level, STAT.seen_split)
  live = bucketed(K_ITEMS, STAT.live_level, STAT.live_split)
  -- The known items' keys share the job's prefix (and hash tag) with the live items' buckets.
  known = bucketed(str_sub(K_ITEMS, 1, -3) .. 'k:', STAT.known_level, STAT.known_split)
  known.names = str_sub(K_ITEMS, 1, -3) .. 'u:'
end

local function names_key(bucket)
  return known.names .. str_sub(bucket, #known.prefix + 1)
end

-- A record's fields (the layout in tracker/revisits.py), and the unsigned big-endian integers
-- it holds. One table: the library's top-level locals count against Lua's limit of 200 in the
-- script form of the item scripts.
local records = {}

function records.u16(s, at)
  local a, b = string.byte(s, at, at + 1)
  return a * 256 + b
end

function records.u32(s, at)
  local a, b, c, d = string.byte(s, at, at + 3)
  return ((a * 256 + b) * 256 + c) * 256 + d
end

function records.u32_bytes(n)
  n = math.floor(n)
  return string.char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
    math.floor(n / 256) % 256, n % 256)
end

-- A record as text for a reply (hex), and back from an argument.
function records.to_hex(record)
  return (string.gsub(record, '.', function(c) return str_format('%02x', string.byte(c)) end))
end

function records.from_hex(text)
  return (string.gsub(text, '..', function(h) return string.char(tonumber(h, 16)) end))
end

-- The last second the record's item is not due yet (Unix seconds): the start of the
-- generation that fetched it (s, whole seconds) plus its interval (i) less one, or s for i = 0.
-- It is due in a generation that starts later (whole seconds: a generation starts in a later
-- second than the one before, generation.lua), and never again in the one that fetched it.
function records.due_after(started, interval)
  return started + math.max(interval, 1) - 1
end

function records.due(record)
  return records.u32(record, 1)
end

function records.depth(record)
  return string.byte(record, 5)
end

-- The record's interval in seconds (it keeps whole minutes; `at`: where they are).
function records.interval(record, at)
  return records.u16(record, at or 7) * 60
end

-- When the page a record describes last changed, as far as the job knows: its Last-Modified
-- (kept when its server sent no ETag), or else the start of the generation that fetched it (its due time less its interval).
function records.fetched(record)
  if string.byte(record, 15) == 0 and #record == 19 then return records.u32(record, 16) end
  return records.u32(record, 1) - math.max(records.interval(record), 1) + 1
end

local function known_slot(item)
  bucket_geometry()
  local fp, a = fingerprint(item)
  return bucket_of(known, a), fp
end

-- The record of known `item`; nil if it is not known (no command at all for a job without any).
local function known_record(item)
  bucket_geometry()
  if known.count == 0 then return nil end
  local key, fp = known_slot(item)
  return redis_call('HGET', key, fp) or nil  -- a missing field is false in Redis's Lua
end

local function known_rehash(from, to, moves)
  local keep, moving = {}, {}
  for _, item in ipairs(redis_call('LRANGE', names_key(from), '0', '-1')) do
    local fp = fingerprint(item)
    if moves(fp) then
      moving[#moving + 1] = item
    else
      keep[#keep + 1] = item
    end
  end
  if #moving == 0 then return end
  local records = {}
  for _, item in ipairs(moving) do
    local fp = fingerprint(item)
    local record = redis_call('HGET', from, fp)
    redis_call('HDEL', from, fp)
    records[#records + 1] = fp
    records[#records + 1] = record
  end
  redis_call('DEL', names_key(from))
  in_slices('RPUSH', names_key(from), keep, 256)
  in_slices('RPUSH', names_key(to), moving, 256)
  in_slices('HSET', to, records, 256)
end

-- Keep `record` for `item` (known from now on, if it was not).
local function remember_known(item, record)
  local key, fp = known_slot(item)
  if redis_call('HSET', key, fp, record) == 0 then return end  -- known already: record updated
  redis_call('RPUSH', names_key(key), item)
  known.count = known.count + 1
  count(STAT.known_size, 1)
  if known.count > 48 * (known.span + known.split) and known.level < 33 then
    split_bucket(known, known_rehash)
  end
end

-- `item` is known no more (gone for good).
local function forget_known(item)
  if known_record(item) == nil then return end
  local key, fp = known_slot(item)
  redis_call('HDEL', key, fp)
  redis_call('LREM', names_key(key), '1', item)
  known.count = known.count - 1
  count(STAT.known_size, -1)
end

-- Whether `item`, not live, is done for now: in the seen set, or known (its next due generation
-- queues it).
local function is_finished(item)
  return is_done(item) or known_record(item) ~= nil
end
