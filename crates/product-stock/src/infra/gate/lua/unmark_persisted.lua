-- Undoes mark_persisted.lua for an order whose database transaction did not commit after the
-- gate was told: P -> H, its units back in `held` and the order back in the sweep's queue.
-- Run under the product's stock row lock, once the database is known not to hold the
-- reservation, so the gate again withholds units the database does not count as reserved.
-- KEYS: 1 avail, 2 held, 3 pending, 4 the order's record, 5 epoch
-- ARGV: 1 order id, 2 now ms
-- Reply: 1 when the record went back to H, 0 when there was nothing to undo.
local rec = redis.call('HMGET', KEYS[4], 's', 'q', 't')
if rec[1] ~= 'P' then
  return 0
end
redis.call('HSET', KEYS[4], 's', 'H')
redis.call('ZADD', KEYS[3], rec[3] or ARGV[2], ARGV[1])
-- Without a counter the gate was lost: the rebuild holds the order again (it is pending).
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('INCRBY', KEYS[2], rec[2])
  redis.call('INCR', KEYS[5])
end
return 1
