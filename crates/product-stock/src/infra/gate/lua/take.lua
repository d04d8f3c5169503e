-- The first step of moving units between two stock buckets of one product
-- (docs/architecture.md#stock-buckets): takes units out of this bucket (the donor) for a bucket
-- that ran dry, and records the transfer here until it is settled (settle_transfer.lua). The
-- units are in no bucket's counter meanwhile, only in `moving`: a crash before they land strands
-- them, never doubles them, and the sweeper and the reconciler settle what is left (land.lua in
-- mode 'cancel').
-- Takes at least what the dry bucket needs and half of what this one has, so a sale's tail does
-- not move units one at a time.
-- KEYS: 1 avail, 2 moving, 3 transfers, 4 generation, 5 refills
-- ARGV: 1 transfer id, 2 units needed (>= 1), 3 the receiving bucket, 4 now ms
-- Reply: {'N'} not loaded | {'E', moving, refills} nothing to lend
--      | {'T', qty, generation} taken
local avail = redis.call('GET', KEYS[1])
if not avail then
  return {'N'}
end
avail = tonumber(avail)
if avail <= 0 then
  return {'E', tonumber(redis.call('GET', KEYS[2]) or '0'), redis.call('GET', KEYS[5]) or ''}
end
local qty = math.max(tonumber(ARGV[2]), math.floor(avail / 2))
if qty > avail then
  qty = avail
end
local generation = redis.call('GET', KEYS[4]) or ''
redis.call('DECRBY', KEYS[1], qty)
redis.call('INCRBY', KEYS[2], qty)
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3] .. ':' .. qty .. ':' .. generation .. ':' .. ARGV[4])
return {'T', qty, generation}
