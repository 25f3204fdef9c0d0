-- The item scripts' library, part 7 of 10 (scripts.LIBRARY): the frontier and dispatch. New items
-- added to their domains' queues, and queued items handed out within the broker's bound.

-- The priorities of a call's items from their text: '' all 0, one number for all, or one number
-- per item separated by spaces. Returns a table of them, or the one priority for all.
local function parse_priorities(text)
  if text == '' then return 0 end
  local out = {}
  for p in string.gmatch(text, '%S+') do
    local n = tonumber(p)
    if not n or n ~= math.floor(n) or n < -PRIORITY_MAX or n > PRIORITY_MAX then
      error('bad priority: ' .. p)
    end
    out[#out + 1] = n
  end
  if #out == 1 then return out[1] end
  return out
end

-- Queue the new items among args[first..] (a script's ARGV) at `depth`, deduplicated, within the
-- job's max_pages and max_pages_per_domain (an item over a limit is dropped, not remembered).
-- `priorities` (text, see parse_priorities): each item's priority, kept in its rank. Returns
-- how many.
local function add_items(args, first, depth, priorities)
  if not page_limits then
    local policy = redis_call('HMGET', K_POLICY, 'max_pages', 'max_pages_per_domain')
    page_limits = {tonumber(policy[1] or ''), tonumber(policy[2] or '')}
  end
  local max_pages, per_domain = page_limits[1], page_limits[2]
  local room = math.huge
  if max_pages then room = max_pages - counters('seen')[1] end
  -- The new items' names are written a slice at a time (one RPUSH per domain); those of a
  -- priority other than 0 go to the domain's zset, in the order they came.
  local added, new_by_domain, domains = 0, {}, {}
  local ranked, ranked_count = {}, 0
  local each = parse_priorities(priorities or '')
  local value = pack('q', depth)
  caching_items = false
  for i = first, #args do
    if added >= room then break end
    local item = args[i]
    local domain = domain_of(item)
    local priority = each
    if type(each) == 'table' then priority = each[i - first + 1] or 0 end
    if not per_domain or tonumber(redis_call('HGET', K_DSEEN, domain) or '0') < per_domain then
      -- New: not done, and not live (HSETNX makes it live unless it is, earlier in this batch
      -- too). A listpack bucket is searched field by field: one search, not two.
      local key, fp = live_slot(item)
      local packed = value
      if priority ~= 0 then packed = pack('q', rank_of(depth, priority)) end
      if not is_finished(item) and redis_call('HSETNX', key, fp, packed) == 1 then
        if per_domain then redis_call('HINCRBY', K_DSEEN, domain, '1') end
        local new_items = new_by_domain[domain]
        if not new_items then
          new_items = {}
          new_by_domain[domain] = new_items
          domains[#domains + 1] = domain
        end
        if priority ~= 0 then
          ranked_count = ranked_count + 1
          new_items[#new_items + 1] = {item, priority, ranked_count}
        else
          new_items[#new_items + 1] = item
        end
        added = added + 1
      end
    end
  end
  caching_items = true
  if added == 0 then return 0 end
  local arrival_base = 0
  if ranked_count > 0 then
    use_priorities()
    arrival_base = arrivals(ranked_count) - ranked_count
  end
  for _, domain in ipairs(domains) do
    local new_items = new_by_domain[domain]
    if ranked_count > 0 then  -- split the domain's new items: the list's, and the zset's
      local listed, scored = {}, {}
      for _, entry in ipairs(new_items) do
        if type(entry) == 'table' then
          scored[#scored + 1] = int_text(queue_score(entry[2], arrival_base + entry[3], false))
          scored[#scored + 1] = entry[1]
        else
          listed[#listed + 1] = entry
        end
      end
      new_items = listed
      in_slices('ZADD', priority_queue(domain), scored, 256)
    end
    for i = 1, #new_items, 256 do  -- slices keep unpack far from Lua's stack limit
      redis_call('RPUSH', K_QUEUES .. domain, unpack(new_items, i, math.min(i + 255, #new_items)))
    end
    schedule(domain)
  end
  count('seen', added)
  count('queued', added)
  grow_live()
  reactivate()
  return added
end

-- The next queued entry of `domain`: the head of its zset if its priority is above 0, else the
-- head of its list, else the head of its zset (a priority below 0); nil if none.
local function next_entry(domain)
  if not priorities_used then return redis_call('LPOP', K_QUEUES .. domain) end
  local zset = priority_queue(domain)
  local head = redis_call('ZRANGE', zset, '0', '0', 'WITHSCORES')
  if head[1] and tonumber(head[2]) < PRIORITY_ZERO then
    redis_call('ZREM', zset, head[1])
    return head[1]
  end
  local item = redis_call('LPOP', K_QUEUES .. domain)
  if item or not head[1] then return item end
  redis_call('ZREM', zset, head[1])
  return head[1]
end

-- The next queued item of `domain` (the highest priority, then the first come) and its rank,
-- stale entries dropped; nil if none.
local function pop_queued(domain)
  while true do
    local item = next_entry(domain)
    if not item then return nil end
    local v = live_get(item)
    if v and str_sub(v, 1, 1) == 'q' then return item, str_sub(v, 2) end
  end
end

-- Backed-off items whose time came go to the back of their domain's queue.
local function promote_due(max_batch)
  local due = redis_call('ZRANGEBYSCORE', K_DELAYED, '-inf', int_text(redis_now()), 'LIMIT', '0',
    int_text(max_batch))
  for _, item in ipairs(due) do
    redis_call('ZREM', K_DELAYED, item)
    local v = live_get(item)
    if v and str_sub(v, 1, 1) == 'w' then
      live_set(item, 'q', str_sub(v, 2))
      count('queued', 1)
      enqueue(item, false, str_sub(v, 2))
    end
  end
end

-- How many more scrape messages the broker may take under `bound`, the text
-- '<scrape messages> <save pages>' that callers pass: the most scrape messages, and the most
-- pages of save messages (and of saves kept for a batch), of this job (of this shard) the broker
-- may hold. Saves waiting over their bound hold dispatch back too, so slow saving slows the
-- scraping rather than filling the broker.
local function dispatch_room(bound)
  local scrapes, saves = string.match(bound, '^(%d+) (%d+)$')
  if not scrapes then error('bad dispatch bound: ' .. bound) end
  local room = tonumber(scrapes) - redis_call('ZCARD', K_DISPATCHED)
  local save_room = tonumber(saves) - redis_call('ZCARD', K_PENDING)
  if save_room < room then room = save_room end
  return room
end

-- Move queued items to `dispatched` while dispatch_room(bound) allows (at most `max_batch` per
-- call), and return them; the caller publishes one scrape task for each, ahead of the broker's
-- queue for an item returned as a one-item table (goes_first). Domains take turns,
-- those waiting longest first (with their head starts), one item per turn; a domain with an
-- interval gets one turn per interval, and none at its in-flight cap.
local function take_for_dispatch(bound, max_batch, deadline, out)
  if topup_deferred then
    deferred_topup = {bound, max_batch, deadline}
    return out
  end
  promote_due(max_batch)
  if dispatch_held() then return out end
  local room = dispatch_room(bound)
  if room > max_batch then room = max_batch end
  if room <= 0 then return out end
  local now = redis_now()
  local taken = 0
  -- Each round serves every ready domain once (or drops it, its queue empty), so it ends. A
  -- round that found fewer domains than it asked for found them all: another is needed only if
  -- one of them got its next turn at once.
  while room > 0 do
    local asked, again = room, false
    local domains = redis_call('ZRANGEBYSCORE', K_DOMAINS, '-inf', int_text(now), 'LIMIT', '0',
      int_text(room))
    if #domains == 0 then break end
    for _, domain in ipairs(domains) do
      if room == 0 then break end
      local item, depth = pop_queued(domain)
      if not item then
        redis_call('ZREM', K_DOMAINS, domain)
      else
        live_set(item, 'd', depth)
        redis_call('ZADD', K_DISPATCHED, int_text(deadline), item)
        local interval, cap = limits(domain)
        -- The caller publishes an item that comes wrapped in a table ahead of the others.
        out[#out + 1] = (interval == 0 and goes_first(domain)) and {item} or item
        taken = taken + 1
        room = room - 1
        if redis_call('HINCRBY', K_INFLIGHT, domain, '1') >= cap or queue_empty(domain) then
          redis_call('ZREM', K_DOMAINS, domain)
        elseif interval > 0 then
          redis_call('ZADD', K_DOMAINS, int_text(now + interval), domain)
        else
          redis_call('ZADD', K_DOMAINS, int_text(now - head_start(domain)), domain)
          again = true
        end
      end
    end
    if #domains < asked and not again then break end
  end
  if taken > 0 then count('queued', -taken) end
  return out
end

-- One item for a caller that goes on with it itself (complete's carry), taken as
-- take_for_dispatch takes one, with room for one past the bound's scrapes: the slot the caller
-- frees. Never deferred to a batch's top-up: the item is the caller's own.
local function take_carried(bound, deadline, out)
  local saves = string.match(bound, '^%d+ (%d+)$')
  if not saves then error('bad dispatch bound: ' .. bound) end
  local deferred = topup_deferred
  topup_deferred = false
  take_for_dispatch((redis_call('ZCARD', K_DISPATCHED) + 1) .. ' ' .. saves, 1, deadline, out)
  topup_deferred = deferred
end

-- Dispatched `item` (at `depth`, its rank, of `domain`) goes back to the head of its priority in
-- its queue: its checkout was throttled, or its job is held. vacate lists the domain again.
local function undispatch(item, depth, domain)
  redis_call('ZREM', K_DISPATCHED, item)
  live_set(item, 'q', depth)
  count('queued', 1)
  enqueue(item, true, depth, true)
  vacate(domain)
end
