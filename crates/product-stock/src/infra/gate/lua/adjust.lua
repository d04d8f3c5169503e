-- Restock (+) or write-off (-) from a `stock.adjusted` event, once per request id, and only in
-- the gate generation the database change was committed in (a gate rebuilt since counted it).
-- KEYS: 1 avail, 2 the request's marker, 3 epoch, 4 refills, 5 generation
-- ARGV: 1 delta, 2 marker ttl ms, 3 expected generation ('' = any)
-- Reply: {'D', marker} seen before | {'N'} not loaded | {'G'} rebuilt since
--      | {'A', applied, available, clamped}
-- The marker holds 'A:<applied>' (older markers: 'A'), 'N' (not loaded) or 'G' (rebuilt since):
-- a write-off spread over stock buckets replays from what each bucket applied.
local seen = redis.call('GET', KEYS[2])
if seen then
  return {'D', seen}
end
local avail = redis.call('GET', KEYS[1])
if not avail then
  -- The rebuild reads the database, which already has this adjustment; the marker keeps a
  -- redelivery after the rebuild from counting it twice.
  redis.call('SET', KEYS[2], 'N', 'PX', ARGV[2])
  return {'N'}
end
if ARGV[3] ~= '' and (redis.call('GET', KEYS[5]) or '') ~= ARGV[3] then
  redis.call('SET', KEYS[2], 'G', 'PX', ARGV[2])
  return {'G'}
end
avail = tonumber(avail)
local delta = tonumber(ARGV[1])
local after = avail + delta
local clamped = 0
if delta < 0 and after < 0 then
  -- A write-off never drives the counter below zero (nor lower than it already is).
  clamped = 1
  if avail > 0 then
    redis.call('SET', KEYS[1], '0')
    after = 0
  else
    after = avail
  end
else
  after = redis.call('INCRBY', KEYS[1], ARGV[1])
end
redis.call('SET', KEYS[2], 'A:' .. (after - avail), 'PX', ARGV[2])
redis.call('INCR', KEYS[3])
redis.call('INCR', KEYS[4])
return {'A', after - avail, after, clamped}
