-- Restock (+) or write-off (-), once per request id, and only in the gate generation the
-- database change was committed in (a gate rebuilt since counted it).
-- KEYS: 1 avail, 2 the request's marker, 3 epoch, 4 refills, 5 generation, 6 held
-- ARGV: 1 delta, 2 marker ttl ms, 3 expected generation ('' = any), 4 '' to apply (a write-off
--       takes what the counter has, never driving it below zero), or, for an admin's write-off,
--       the database's free figure (on_hand - reserved): the write-off is refused unless it
--       fits in the units free, min(avail, figure - held), and writes nothing then
-- Reply: {'D', marker} seen before | {'N'} not loaded | {'G'} rebuilt since
--      | {'R', free} refused | {'A', applied, available, clamped}
-- The marker holds 'A:<applied>' (older markers: 'A'), 'N' (not loaded) or 'G' (rebuilt since):
-- a write-off spread over stock buckets replays from what each bucket applied. A refused
-- write-off leaves no marker, so a retry of its request is judged afresh.
local strict = ARGV[4] ~= ''
local seen = redis.call('GET', KEYS[2])
if seen then
  return {'D', seen}
end
local avail = redis.call('GET', KEYS[1])
if not avail then
  if strict then
    return {'N'}
  end
  -- The rebuild reads the database, which already has this adjustment; the marker keeps a
  -- redelivery after the rebuild from counting it twice.
  redis.call('SET', KEYS[2], 'N', 'PX', ARGV[2])
  return {'N'}
end
if ARGV[3] ~= '' and (redis.call('GET', KEYS[5]) or '') ~= ARGV[3] then
  if strict then
    return {'G'}
  end
  redis.call('SET', KEYS[2], 'G', 'PX', ARGV[2])
  return {'G'}
end
avail = tonumber(avail)
local delta = tonumber(ARGV[1])
if strict and delta < 0 then
  -- Units held for acknowledged orders the database does not have yet are not free: taking
  -- them would cancel those orders when their `order.created` arrives.
  local free = math.min(avail, tonumber(ARGV[4]) - tonumber(redis.call('GET', KEYS[6]) or '0'))
  if free < 0 then
    free = 0
  end
  if -delta > free then
    return {'R', free}
  end
end
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
