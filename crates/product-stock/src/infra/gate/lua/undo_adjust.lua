-- Takes back the part of an admin's write-off one stock bucket applied, when the write-off as a
-- whole was refused (other buckets had too little) and its database transaction rolls back:
-- the units go back to the counter and the marker goes, so a retry is judged afresh.
-- KEYS: 1 avail, 2 the request's marker, 3 epoch, 4 refills
-- Reply: the units given back
local seen = redis.call('GET', KEYS[2])
if not seen then
  return 0
end
redis.call('DEL', KEYS[2])
local applied = tonumber(string.match(seen, '^A:(%-?%d+)$') or '0')
if applied >= 0 or redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('INCRBY', KEYS[1], -applied)
redis.call('INCR', KEYS[3])
redis.call('INCR', KEYS[4])
return -applied
