-- Gives an order's units back (or, in mode 'drop', forgets its hold without giving them back),
-- once: the record moves to X, so a replay changes nothing.
-- KEYS: 1 avail, 2 held, 3 pending, 4 users, 5 the order's record, 6 epoch, 7 refills
-- ARGV: 1 order id, 2 user id, 3 qty, 4 released record ttl ms,
--       5 mode: 'any' (H or P or no record), 'hold' (H only), 'drop' (H only, units not returned)
-- Reply: {'N'} not loaded | {'X'} already released | {'F', state} nothing held
--      | {from, qty, available} with from H (hold), P (persisted), M (no record), D (dropped)
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'N'}
end
local mode = ARGV[5]
local rec = redis.call('HMGET', KEYS[5], 's', 'q', 'u')
local state = rec[1]
if state == 'X' then
  return {'X'}
end
if state == 'H' and not redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  -- A hold that survived a rebuild which did not hold it again: the rebuild counted its units
  -- from the database, so it stands for a persisted order (P), never for units to give back.
  state = 'P'
end
local qty, user = ARGV[3], ARGV[2]
if state == 'H' then
  qty, user = rec[2], rec[3]
elseif state == 'P' and mode == 'any' then
  qty, user = rec[2], rec[3]
elseif not state and mode == 'any' then
  state = 'M'
else
  return {'F', state or ''}
end
local available
if mode == 'drop' then
  available = tonumber(redis.call('GET', KEYS[1]))
else
  available = redis.call('INCRBY', KEYS[1], qty)
  -- Units came back: a new buyer may take them (see buyers.lua).
  redis.call('INCR', KEYS[7])
end
if redis.call('HINCRBY', KEYS[4], user, '-' .. qty) <= 0 then
  redis.call('HDEL', KEYS[4], user)
end
if state == 'H' then
  -- An unpersisted hold: the database never counted it, so only the gate changes.
  redis.call('DECRBY', KEYS[2], qty)
else
  -- The database's `reserved` shrank first; this is its follow-up.
  redis.call('INCR', KEYS[6])
end
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[5], 's', 'X', 'q', qty, 'u', user)
-- Released: the record only answers replays for a short while more (the database answers
-- them after), so a buyer ordering and cancelling in a loop leaves no key behind.
redis.call('PEXPIRE', KEYS[5], ARGV[4])
if mode == 'drop' then
  state = 'D'
end
return {state, tonumber(qty), available}
