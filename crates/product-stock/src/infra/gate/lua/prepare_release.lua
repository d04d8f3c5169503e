-- The first half of a release that follows a database change: marks the order's units as on
-- their way back (state B) while the database transaction that releases the reservation is
-- still open. Nothing moves yet: `avail`, `held` and the buyer's count change only in
-- settle_release.lua, once the transaction has committed. A release that fails to commit
-- therefore never puts units on sale that the database still counts as reserved.
-- KEYS: 1 avail, 2 the order's record, 3 releasing, 4 generation, 5 pending
-- ARGV: 1 order id, 2 user id, 3 qty, 4 record ttl ms, 5 mode: 'any' (H or P or no record)
--       or 'hold' (H only), 6 now ms
-- Reply: {'N'} not loaded | {'X'} already released | {'F', state} nothing held
--      | {'B', from, qty} prepared (again), from H (hold), P (persisted) or M (no record)
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'N'}
end
local mode = ARGV[5]
local generation = redis.call('GET', KEYS[4]) or ''
local rec = redis.call('HMGET', KEYS[2], 's', 'q', 'u', 'f', 'g')
local state = rec[1]
if state == 'X' then
  return {'X'}
end
if state == 'B' then
  if rec[5] == generation then
    -- An earlier attempt prepared it and did not commit (or this one would not run).
    if mode == 'any' or rec[4] == 'H' then
      redis.call('PEXPIRE', KEYS[2], ARGV[4])
      redis.call('ZADD', KEYS[3], ARGV[6], ARGV[1])
      return {'B', rec[4], tonumber(rec[2])}
    end
    return {'F', 'B'}
  end
  -- Prepared before the gate was rebuilt, by an attempt that did not commit: the rebuild read
  -- the reservation as still held and did not re-create a hold for an order no longer pending.
  if mode ~= 'any' then
    return {'F', 'B'}
  end
  state = nil
end
if state == 'H' and not redis.call('ZSCORE', KEYS[5], ARGV[1]) then
  -- A hold that survived a rebuild which did not hold it again (see release.lua).
  state = 'P'
end
local from, qty, user
if state == 'H' then
  from, qty, user = 'H', rec[2], rec[3]
elseif state == 'P' and mode == 'any' then
  from, qty, user = 'P', rec[2], rec[3]
elseif not state and mode == 'any' then
  from, qty, user = 'M', ARGV[3], ARGV[2]
else
  return {'F', state or ''}
end
redis.call('HSET', KEYS[2], 's', 'B', 'f', from, 'q', qty, 'u', user, 'g', generation)
-- Long enough for the commit and for a crashed consumer's redelivery to finish it.
redis.call('PEXPIRE', KEYS[2], ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[6], ARGV[1])
return {'B', from, tonumber(qty)}
