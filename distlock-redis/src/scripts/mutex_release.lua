-- Release a distlock mutex (the plain one): compare-and-delete, then hand
-- over to the next waiting provider.
-- KEYS[1] lock key, KEYS[2] fair queue, KEYS[3] fair queue deadlines,
-- KEYS[4] holder record, KEYS[5] fair waiters' owners (as release.lua: fair
-- waiters of the same name go first), KEYS[6] the waiting providers
-- ({lock key}:waiting, zset provider id -> place), KEYS[7] the hand-over
-- reservation ({lock key}:handoff), KEYS[8] the line's liveness
-- ({lock key}:waiting:alive, see line_pop.lua)
-- ARGV[1] owner token, ARGV[2] release channel, ARGV[3] reservation TTL in ms
-- Returns 1 when released, 0 when the lock is not ours (nothing changed).
-- The hand-over: 'to:<id>' of the first live fair waiter; else the first
-- live waiting provider is taken off the line (dead ones are dropped), the lock is reserved for it for
-- ARGV[3] ms and 'to:<provider id>' wakes one waiter there (one wake-up per
-- release across all providers); else 'released' (nobody in line: one plain
-- waiter of each provider that waits wakes, as for clients that do not
-- queue).
local value = redis.pcall('GET', KEYS[1])
if value ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[4])
local head = nil
if redis.call('EXISTS', KEYS[2]) == 1 and redis.call('TYPE', KEYS[2])['ok'] == 'zset'
    and redis.call('TYPE', KEYS[3])['ok'] == 'zset' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for _, dead in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do
    redis.call('ZREM', KEYS[2], dead)
    redis.call('ZREM', KEYS[3], dead)
    redis.pcall('HDEL', KEYS[5], dead)
  end
  head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  while head and not redis.call('ZSCORE', KEYS[3], head) do
    redis.call('ZREM', KEYS[2], head)
    redis.pcall('HDEL', KEYS[5], head)
    head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  end
end
if head then
  redis.call('PUBLISH', ARGV[2], 'to:' .. head)
  return 1
end
local nxt = pop_live(KEYS[6], KEYS[8])
if nxt then
  redis.call('SET', KEYS[7], nxt, 'PX', ARGV[3])
  redis.call('PUBLISH', ARGV[2], 'to:' .. nxt)
else
  redis.call('PUBLISH', ARGV[2], 'released')
end
return 1
