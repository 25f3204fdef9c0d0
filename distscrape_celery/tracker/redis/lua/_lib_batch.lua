-- The item scripts' library, part 10 of 10 (scripts.LIBRARY): a batch of item-script calls run as
-- one call.

-- -- batches ----------------------------------------------------------------------------------

-- The end of a batch's deferred counting: the counters and tokens written, the live-item buckets
-- split if the batch added enough.
local function end_counts()
  write_counts()
  write_lease_times()
  counts_deferred = false
  if grow_deferred then
    grow_deferred = false
    grow_live()
  end
end

-- A batch of item-script calls in one call (scripts.py's BATCH: a save batch's begins or
-- completes, the calls a process's threads make at the same time): ARGV[1] the calls, then for
-- each its script's name, whether it takes a key of its own ('1' or '0'), its argument count and
-- its arguments; `runs` holds the run function of each name. KEYS are the item keys, then the
-- keys of their own of the calls that take one (KEYS[22] of the script alone), in order. Each
-- call runs with KEYS and ARGV of its own (the job's key names, set by _begin.lua from the
-- batch's KEYS, are the same for every call); the reply is the list of their replies.
-- _begin.lua's checks run once, and so do the dispatch top-up (only the last call's reply hands
-- items out) and the writes of the job's counters. A call that raises ends the batch, the calls
-- before it kept, their counts written.
local ITEM_KEYS = 21
local function batch(runs)
  return function(keys, args)
    local calls = tonumber(args[1])
    local call_keys, replies = {}, {}
    topup_deferred, deferred_topup = true, nil
    counts_deferred = true
    for k = 1, ITEM_KEYS do call_keys[k] = keys[k] end
    local succeeded, failure = pcall(function()
      local position, next_key = 2, ITEM_KEYS + 1
      for i = 1, calls do
        local run = runs[args[position]]
        if not run then error('no batch form of item script ' .. tostring(args[position])) end
        if args[position + 1] == '1' then
          call_keys[ITEM_KEYS + 1] = keys[next_key]
          next_key = next_key + 1
        else
          call_keys[ITEM_KEYS + 1] = nil
        end
        local n = tonumber(args[position + 2])
        local call_args = {}
        for j = 1, n do call_args[j] = args[position + 2 + j] end
        position = position + 3 + n
        replies[i] = run(call_keys, call_args)
      end
      topup_deferred = false
      -- One top-up, with the room the whole batch made, its items after the last reply's own
      -- (whether or not that call reached its top-up: it may have returned early).
      if deferred_topup then
        take_for_dispatch(deferred_topup[1], deferred_topup[2], deferred_topup[3], replies[calls])
      end
    end)
    topup_deferred = false
    end_counts()
    if not succeeded then error(failure, 0) end
    return replies
  end
end
