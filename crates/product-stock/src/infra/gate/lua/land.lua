-- The second step of a transfer between stock buckets, on the receiving bucket: gives the units
-- (mode 'give', by the borrower right after take.lua) or rules that they will never come (mode
-- 'cancel', by the reconciler). Whichever runs first decides, once: the marker records it, so a
-- borrower resuming after the reconciler cancelled gives nothing, and the donor takes its units
-- back only once the transfer is known not to have landed. A transfer from before a rebuild (an
-- older generation) never lands: the rebuild counted its units afresh.
-- KEYS: 1 avail, 2 the transfer's landing marker, 3 generation, 4 refills
-- ARGV: 1 mode 'give' | 'cancel', 2 qty, 3 the transfer's generation, 4 marker ttl ms
-- Reply: {'G', available} given (now or before: then {'G'}) | {'C'} cancelled | {'S'} stale
local seen = redis.call('GET', KEYS[2])
if seen then
  return {seen}
end
if ARGV[1] == 'cancel' then
  redis.call('SET', KEYS[2], 'C', 'PX', ARGV[4])
  return {'C'}
end
if redis.call('EXISTS', KEYS[1]) == 0 or (redis.call('GET', KEYS[3]) or '') ~= ARGV[3] then
  redis.call('SET', KEYS[2], 'S', 'PX', ARGV[4])
  return {'S'}
end
local available = redis.call('INCRBY', KEYS[1], ARGV[2])
-- Units came back to this bucket: a new buyer may take them (see buyers.lua).
redis.call('INCR', KEYS[4])
redis.call('SET', KEYS[2], 'G')
return {'G', available}
