-- The database now holds this order's reservation: H -> P, and its units leave `held`
-- (the database's `reserved` grew by the same amount). A hold the gate no longer counts (not
-- in the sweep's queue: it survived a rebuild that did not hold it again) moves no units.
-- KEYS: 1 avail, 2 held, 3 pending, 4 the order's record, 5 epoch
-- ARGV: 1 order id
-- Reply: 1 when the hold moved to P, 0 when there was nothing to do.
local rec = redis.call('HMGET', KEYS[4], 's', 'q')
if rec[1] ~= 'H' then
  return 0
end
local counted = redis.call('ZSCORE', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[4], 's', 'P')
redis.call('ZREM', KEYS[3], ARGV[1])
-- Without a counter the gate was lost: the rebuild counts this reservation from the database.
if counted and redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('DECRBY', KEYS[2], rec[2])
  redis.call('INCR', KEYS[5])
end
return 1
