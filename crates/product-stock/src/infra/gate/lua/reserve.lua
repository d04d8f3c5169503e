-- Takes qty units of one product for one order, once (docs/architecture.md#the-stock-model).
-- KEYS: 1 avail, 2 held, 3 pending, 4 users, 5 the order's record, 6 node (cluster only)
-- ARGV: 1 order id, 2 user id, 3 qty, 4 per-user limit (0 = none), 5 now ms, 6 record ttl ms,
--       7 sale start ms (0 = none), 8 sale end ms (0 = none)
-- Reply: {'H', remaining, gate ms} reserved | {'S'} sold out | {'L', bought} user limit
--      | {'B', gate ms, start ms} before the sale | {'E', gate ms, end ms} after it
--      | {'I', available} insufficient | {'N'} not loaded | {'C'} order id reused
--      | {'R', state, n} replay of the order's first answer (n as first answered)
-- The sale window is judged by this server's clock (TIME), never by the caller's: every replica
-- of every service asks the same clock, so a sale opens at one instant for all of them.
-- A refusal (S, L, I, B, E) writes nothing: a buyer retrying at their limit with fresh ids, or a flood
-- on a sold-out product, creates no key. Only a hold is recorded (state H; older versions also
-- recorded L and I, which a replay still answers while those records live).
local node = redis.call('GET', KEYS[6])
if node and node ~= redis.call('CLUSTER', 'MYID') then
  -- A Redis Cluster replica promoted after the node that loaded this gate failed: replication
  -- is asynchronous, so the counters may lack holds already acknowledged to buyers. Sell
  -- nothing from them: the counters go (the order records stay, as after any partial loss)
  -- and the gate is rebuilt from the database and the acknowledged orders.
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[6])
  return {'N'}
end
local rec = redis.call('HMGET', KEYS[5], 's', 'q', 'u', 'n')
if rec[1] == 'H' and rec[2] == ARGV[3] and rec[3] == ARGV[2]
    and not redis.call('ZSCORE', KEYS[3], ARGV[1]) and redis.call('EXISTS', KEYS[1]) == 1 then
  -- A hold that survived a rebuild which did not hold it again (the order was never written,
  -- so the order service did not list it as pending): the gate no longer counts its units.
  -- Answering it as a replay would let the order be written with no units behind it; its
  -- retry takes them afresh instead.
  redis.call('DEL', KEYS[5])
  rec = {}
end
if rec[1] then
  if rec[2] ~= ARGV[3] or rec[3] ~= ARGV[2] then
    return {'C'}
  end
  return {'R', rec[1], tonumber(rec[4]) or 0}
end
local avail = redis.call('GET', KEYS[1])
if not avail then
  -- Never DECRBY a missing counter: it would start below zero.
  return {'N'}
end
avail = tonumber(avail)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local start, stop = tonumber(ARGV[7]) or 0, tonumber(ARGV[8]) or 0
-- After the counter exists (a lost gate is rebuilt by the crowd before the opening, not at it)
-- and before it is read (refusals before the opening cost no write).
if start > 0 and now < start then
  return {'B', now, start}
end
if stop > 0 and now >= stop then
  return {'E', now, stop}
end
if avail <= 0 then
  -- Checked before the user limit and not recorded: a sold-out flood costs no writes.
  return {'S'}
end
local qty = tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
if limit > 0 then
  local bought = tonumber(redis.call('HGET', KEYS[4], ARGV[2]) or '0')
  if bought + qty > limit then
    return {'L', bought}
  end
end
if avail < qty then
  return {'I', avail}
end
local remaining = redis.call('DECRBY', KEYS[1], ARGV[3])
redis.call('HINCRBY', KEYS[4], ARGV[2], ARGV[3])
redis.call('INCRBY', KEYS[2], ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
redis.call('HSET', KEYS[5], 's', 'H', 'q', ARGV[3], 'u', ARGV[2], 'n', remaining, 't', ARGV[5])
redis.call('PEXPIRE', KEYS[5], ARGV[6])
return {'H', remaining, now}
