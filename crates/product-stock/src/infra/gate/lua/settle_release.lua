-- The second half of a release prepared by prepare_release.lua. 'finish' runs once the
-- database has released the reservation (after the commit, on a redelivery, or by the
-- reconciler under the stock row lock): the units go back to `avail`, once. 'revert' runs when
-- the reconciler finds the database did not release it (the transaction rolled back): the
-- record returns to what it was.
-- A release prepared before the gate was rebuilt is finished without moving units: the rebuild
-- read the database under the same stock row lock, after the release committed, so it already
-- counted them.
-- KEYS: 1 avail, 2 held, 3 pending, 4 users, 5 the order's record, 6 epoch, 7 refills,
--       8 releasing, 9 generation
-- ARGV: 1 order id, 2 mode: 'finish' | 'revert', 3 now ms, 4 released record ttl ms
-- A finished release keeps its record (X) for ARGV[4] only: long enough for a replay of the
-- order's request to be answered from it, short enough that a buyer ordering and cancelling
-- in a loop leaves no key behind (the order service's database answers later replays).
-- Reply: {'F'} nothing prepared | {'S', from} stale, finished without moving units
--      | {'R', from} reverted | {from, qty, available} finished, from H, P or M
redis.call('ZREM', KEYS[8], ARGV[1])
local rec = redis.call('HMGET', KEYS[5], 's', 'q', 'u', 'f', 'g', 't')
if rec[1] ~= 'B' then
  return {'F'}
end
local from, qty, user = rec[4], rec[2], rec[3]
local generation = redis.call('GET', KEYS[9]) or ''
local current = redis.call('EXISTS', KEYS[1]) == 1 and rec[5] == generation
if ARGV[2] == 'revert' then
  if from == 'M' or not current then
    -- Nothing the gate counts stands behind it: forget the record.
    redis.call('DEL', KEYS[5])
  else
    redis.call('HSET', KEYS[5], 's', from)
    if from == 'H' then
      redis.call('ZADD', KEYS[3], rec[6] or ARGV[3], ARGV[1])
    end
  end
  return {'R', from}
end
if not current then
  redis.call('HSET', KEYS[5], 's', 'X')
  redis.call('PEXPIRE', KEYS[5], ARGV[4])
  return {'S', from}
end
local available = redis.call('INCRBY', KEYS[1], qty)
-- Units came back: a new buyer may take them (see buyers.lua).
redis.call('INCR', KEYS[7])
if redis.call('HINCRBY', KEYS[4], user, '-' .. qty) <= 0 then
  redis.call('HDEL', KEYS[4], user)
end
if from == 'H' then
  -- An unpersisted hold: the database never counted it, so only the gate changes.
  redis.call('DECRBY', KEYS[2], qty)
else
  -- The database's `reserved` shrank first; this is its follow-up.
  redis.call('INCR', KEYS[6])
end
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[5], 's', 'X')
redis.call('PEXPIRE', KEYS[5], ARGV[4])
return {from, tonumber(qty), available}
