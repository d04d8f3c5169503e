-- The available counter and the users the gate counts as buyers of one product, read in one
-- atomic step (the order service's sold-out memory, docs/architecture.md#operations), with the
-- product's refills count: bumped whenever units may come back to the counter (a release, an
-- adjustment, a repair; a rebuild starts it afresh from the clock). A new buyer needs units, so
-- while the counter stays at zero and the refills count does not move, the buyers cannot gain
-- anyone.
-- KEYS: 1 avail, 2 users, 3 refills
-- ARGV: 1 most buyers to list, 2 the refills count of a list read before ('' = none)
-- Reply: {'N'} not loaded
--      | {'U', avail, n, refills} the refills count is still ARGV[2]: no list sent
--      | {'T', avail, n, refills} more than ARGV[1] buyers
--      | {'B', avail, n, refills, {user ids}}
local avail = redis.call('GET', KEYS[1])
if not avail then
  return {'N'}
end
local refills = redis.call('GET', KEYS[3]) or ''
local n = redis.call('HLEN', KEYS[2])
if ARGV[2] ~= '' and refills == ARGV[2] then
  return {'U', tonumber(avail), n, refills}
end
if n > tonumber(ARGV[1]) then
  return {'T', tonumber(avail), n, refills}
end
return {'B', tonumber(avail), n, refills, redis.call('HKEYS', KEYS[2])}
