-- The last step of a transfer between stock buckets, on the donor: forgets the transfer once
-- its units landed ('given'), or puts them back into this bucket once they are known never to
-- land ('back'), once. A transfer from before a rebuild is forgotten without moving units.
-- KEYS: 1 avail, 2 moving, 3 transfers, 4 generation, 5 refills
-- ARGV: 1 transfer id, 2 'given' | 'back'
-- Reply: {'F'} nothing to settle | {'S', qty} stale | {'G', qty} | {'B', qty, available}
local v = redis.call('HGET', KEYS[3], ARGV[1])
if not v then
  return {'F'}
end
redis.call('HDEL', KEYS[3], ARGV[1])
local _, qty, g = string.match(v, '^(%d+):(%d+):([^:]*)')
if not qty then
  return {'S', 0}
end
if redis.call('EXISTS', KEYS[1]) == 0 or (redis.call('GET', KEYS[4]) or '') ~= g then
  return {'S', tonumber(qty)}
end
redis.call('DECRBY', KEYS[2], qty)
if ARGV[2] == 'back' then
  local available = redis.call('INCRBY', KEYS[1], qty)
  redis.call('INCR', KEYS[5])
  return {'B', tonumber(qty), available}
end
return {'G', tonumber(qty)}
