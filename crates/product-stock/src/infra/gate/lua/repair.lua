-- Sets the counter to what the database says minus the unpersisted holds, reading `held` here
-- so reservations may flow meanwhile. For one bucket of a product split into stock buckets, the
-- figure is the bucket's share plus its holds plus its units moving to another bucket, which
-- are read here too (a transfer taken meanwhile lands elsewhere; see take.lua).
-- KEYS: 1 avail, 2 held, 3 epoch, 4 refills, 5 moving
-- ARGV: 1 database available, 2 expected epoch ('' = unconditional)
-- Reply: {'N'} not loaded | {'S', epoch} epoch moved | {'R', before, after, held, clamped}
local before = redis.call('GET', KEYS[1])
if not before then
  return {'N'}
end
local epoch = redis.call('GET', KEYS[3]) or '0'
if ARGV[2] ~= '' and epoch ~= ARGV[2] then
  return {'S', tonumber(epoch)}
end
local held = redis.call('GET', KEYS[2]) or '0'
local moving = tonumber(redis.call('GET', KEYS[5]) or '0')
local after, clamped
if tonumber(ARGV[1]) - tonumber(held) - moving < 0 then
  redis.call('SET', KEYS[1], '0')
  after, clamped = 0, 1
else
  redis.call('SET', KEYS[1], ARGV[1])
  after, clamped = redis.call('DECRBY', KEYS[1], held), 0
  if moving > 0 then
    after = redis.call('DECRBY', KEYS[1], moving)
  end
end
redis.call('INCR', KEYS[3])
redis.call('INCR', KEYS[4])
return {'R', tonumber(before), after, tonumber(held), clamped}
