-- The database now holds this order's reservation: H -> P, and its units leave `held`
-- (the database's `reserved` grew by the same amount).
-- KEYS: 1 avail, 2 held, 3 pending, 4 the order's record, 5 epoch
-- ARGV: 1 order id
-- Reply: 1 when the hold moved to P, 0 when there was nothing to do.
local rec = redis.call('HMGET', KEYS[4], 's', 'q')
if rec[1] ~= 'H' then
  return 0
end
redis.call('HSET', KEYS[4], 's', 'P')
redis.call('ZREM', KEYS[3], ARGV[1])
-- Without a counter the gate was lost: the rebuild counts this reservation from the database.
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('DECRBY', KEYS[2], rec[2])
  redis.call('INCR', KEYS[5])
end
return 1
