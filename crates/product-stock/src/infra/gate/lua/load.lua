-- Rebuilds a product's gate after Redis lost it, only if the counter is still missing, so two
-- replicas rebuilding at once count the stock once.
-- KEYS: 1 avail, 2 held, 3 pending, 4 users, 5 epoch, 6 refills
-- ARGV: 1 available, then pairs of user id and units
-- Reply: 1 loaded, 0 already loaded.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('DEL', KEYS[3], KEYS[4])
for i = 2, #ARGV - 1, 2 do
  redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
end
-- A fresh epoch from the clock, so a repair guarded by an epoch read before the loss fails.
-- The refills count starts from the same value, so a buyers list read before the loss is never
-- taken as still current.
local t = redis.call('TIME')
local fresh = t[1] .. string.format('%06d', tonumber(t[2]))
redis.call('SET', KEYS[5], fresh)
redis.call('SET', KEYS[6], fresh)
redis.call('SET', KEYS[2], '0')
redis.call('SET', KEYS[1], ARGV[1])
return 1
