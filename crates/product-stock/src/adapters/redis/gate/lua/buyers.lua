-- The available counter and the users the gate counts as buyers of one product, read in one
-- atomic step (the order service's sold-out short-circuit, ARCHITECTURE §6).
-- KEYS: 1 avail, 2 users
-- ARGV: 1 most buyers to list
-- Reply: {'B', avail, n, {user ids}} | {'T', avail, n} more than ARGV[1] buyers | {'N'} not loaded
local avail = redis.call('GET', KEYS[1])
if not avail then
  return {'N'}
end
local n = redis.call('HLEN', KEYS[2])
if n > tonumber(ARGV[1]) then
  return {'T', tonumber(avail), n}
end
return {'B', tonumber(avail), n, redis.call('HKEYS', KEYS[2])}
