-- Reads the records of pending holds listed by ZRANGEBYSCORE and prunes entries that are no
-- longer unpersisted holds (their record moved on or expired), so they cannot block the sweep.
-- KEYS: 1 pending, 2.. the orders' records
-- ARGV: the order ids, ARGV[i] belonging to KEYS[i + 1]
-- Reply: {pruned, {order id, user, qty, reserved at ms, ...}}
local out, pruned = {}, 0
for i = 2, #KEYS do
  local id = ARGV[i - 1]
  local at = redis.call('ZSCORE', KEYS[1], id)
  if at then
    local rec = redis.call('HMGET', KEYS[i], 's', 'q', 'u')
    if rec[1] == 'H' then
      out[#out + 1] = id
      out[#out + 1] = rec[3]
      out[#out + 1] = rec[2]
      out[#out + 1] = at
    else
      redis.call('ZREM', KEYS[1], id)
      pruned = pruned + 1
    end
  end
end
return {pruned, out}
