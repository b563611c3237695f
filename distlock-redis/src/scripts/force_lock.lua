-- Force-release a mutex / fair mutex (or an election's leader), whoever
-- holds it (a distlock, redis-py or hand-set value): for operators.
-- KEYS[1] lock key, KEYS[2] fencing counter, KEYS[3] fair queue,
-- KEYS[4] queue deadlines, KEYS[5] holder record, KEYS[6] waiters' owners,
-- KEYS[7] (optional) election leader record, KEYS[8] (optional, with
-- KEYS[7]) the election's kind marker (kind.lua), deleted with the leader
-- A mutex's force-release leaves another kind's marker in the lock key
-- alone (it is no mutex hold): nothing is evicted.
-- ARGV[1] the release channel, ARGV[2] the fencing counter's TTL in ms (the
-- fence retention)
-- Returns {holds removed (0 or 1), fencing counter after it was advanced
--         (0: nothing was held, nothing changed)},
--         {-1, index} a key of the wrong type, {-2, 0} the fencing counter
--         is not an integer, {-3, 0} it is exhausted (2^53).
-- The counter is advanced as an acquisition takes a token (fence.lua, which
-- prefixes this script, with queue.lua for the fair purge), so the next
-- holder's token is above it; only when there is a hold to evict: a name
-- nobody holds is left as it is (no counter is created for it). Then
-- exactly what a release publishes: 'to:<id>' of the first live fair waiter,
-- or 'released' when nobody queues (nothing when nothing was held).
local function typed(i, want)
  if not KEYS[i] then return true end
  local t = redis.call('TYPE', KEYS[i])['ok']
  return t == 'none' or t == want
end
local wants = {'string', 'string', 'zset', 'zset', 'hash', 'hash', 'string'}
for i, want in ipairs(wants) do
  if not typed(i, want) then return {-1, i} end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local value = redis.call('GET', KEYS[1])
local evictable = value and not (string.sub(value, 1, 9) == 'distlock:' and not KEYS[7])
local token, refused = fence_if_evicted(evictable, KEYS[2], t, ARGV[2])
if not token then return {refused, 0} end
local evicted = 0
if evictable then
  evicted = redis.call('DEL', KEYS[1])
end
if KEYS[8] and redis.pcall('GET', KEYS[8]) == 'distlock:election' then
  redis.call('DEL', KEYS[8])
end
redis.call('DEL', KEYS[5])
if KEYS[7] then redis.call('DEL', KEYS[7]) end
if evicted == 1 then
  fair_drop_dead(KEYS[3], KEYS[4], KEYS[6], now)
  local head = fair_head(KEYS[3], KEYS[4], KEYS[6])
  if head then
    redis.call('PUBLISH', ARGV[1], 'to:' .. head)
  else
    redis.call('PUBLISH', ARGV[1], 'released')
  end
end
return {evicted, token}
