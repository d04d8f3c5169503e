-- Rebuilds a product's gate after Redis lost it, only if the counter is still missing, so two
-- replicas rebuilding at once count the stock once. Orders acknowledged to their buyers but not
-- yet persisted in the database come back as holds: their units stay out of `avail`, their
-- buyers keep counting them, a replay answers with the order and `order.created` marks them
-- persisted (docs/architecture.md#the-stock-model).
-- Of a product split into stock buckets, each bucket is loaded on its own, with its share of the
-- figure and the same generation for all (transfers between buckets check it, see land.lua).
-- KEYS: 1 avail, 2 held, 3 pending, 4 users, 5 epoch, 6 refills, 7 releasing, 8 generation,
--       9 moving, 10 transfers, 11 node, 12.. the held orders' records
-- ARGV: 1 the database's figure (on_hand - reserved, or on_hand), 2 now ms, 3 record ttl ms,
--       4 generation ('' = fresh from the clock), 5 n, then n pairs of user id and units
--       persisted, then per held order (record KEYS[11 + j]) its order id, user id and qty
-- Reply: {1, avail, held, clamped} loaded | {0} already loaded.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0}
end
-- Transfers out of this bucket from before the load are void: the load counts afresh.
redis.call('DEL', KEYS[3], KEYS[4], KEYS[7], KEYS[9], KEYS[10])
local n = tonumber(ARGV[5])
for i = 6, 5 + 2 * n, 2 do
  redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
end
-- A record that survived the loss and moved on (released, refused) is not a hold: only a
-- missing record, a hold, a release that never committed (B: the order is still pending) or a
-- mark whose `order.created` never committed (P: the database, read under the stock row lock,
-- has no reservation for these orders) is (re)written.
local first = 6 + 2 * n
local holds, held = {}, 0
for j = 12, #KEYS do
  local a = first + 3 * (j - 12)
  local s = redis.call('HGET', KEYS[j], 's')
  if not s or s == 'H' or s == 'B' or s == 'P' then
    holds[#holds + 1] = {KEYS[j], ARGV[a], ARGV[a + 1], ARGV[a + 2]}
    held = held + tonumber(ARGV[a + 2])
  end
end
local avail, clamped = tonumber(ARGV[1]) - held, 0
if avail < 0 then
  -- More acknowledged than the database has: sell nothing more; the database's CHECK refuses
  -- the excess when their `order.created` arrives.
  avail, clamped = 0, 1
end
for _, h in ipairs(holds) do
  redis.call('HSET', h[1], 's', 'H', 'q', h[4], 'u', h[3], 'n', avail, 't', ARGV[2])
  redis.call('PEXPIRE', h[1], ARGV[3])
  redis.call('ZADD', KEYS[3], ARGV[2], h[2])
  redis.call('HINCRBY', KEYS[4], h[3], h[4])
end
-- A fresh epoch from the clock, so a repair guarded by an epoch read before the loss fails.
-- The refills count starts from the same value, so a buyers list read before the loss is never
-- taken as still current.
local t = redis.call('TIME')
local fresh = t[1] .. string.format('%06d', tonumber(t[2]))
redis.call('SET', KEYS[5], fresh)
redis.call('SET', KEYS[6], fresh)
-- A new generation: a release prepared before this load is finished without moving units
-- (settle_release.lua), since the database this load read had already released it.
if ARGV[4] ~= '' then
  redis.call('SET', KEYS[8], ARGV[4])
else
  redis.call('SET', KEYS[8], fresh)
end
-- On a Redis Cluster, the node this gate now lives on (see reserve.lua); elsewhere nothing.
local node = redis.pcall('CLUSTER', 'MYID')
if type(node) == 'string' then
  redis.call('SET', KEYS[11], node)
else
  redis.call('DEL', KEYS[11])
end
redis.call('SET', KEYS[2], held)
redis.call('SET', KEYS[1], avail)
return {1, avail, held, clamped}
