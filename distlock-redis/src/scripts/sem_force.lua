-- Force-release every permit of a semaphore, whoever holds them: for
-- operators. Prefixed with sem_admit.lua and queue.lua. KEYS as sem_acquire.lua;
-- ARGV[1] the release channel, ARGV[2] the fencing counter's TTL in ms (the
-- fence retention); KEYS[8] the kind marker (deleted).
-- Returns {holds removed, fencing counter after it was advanced (0: nothing
--         was held; no counter is created for a name nobody holds)},
--         {-1, index} a key of the wrong type, {-2, 0} the fencing counter
--         is not an integer, {-3, 0} it is exhausted (2^53).
-- The counter is advanced as an acquisition takes a token; the waiters the
-- freed permits let in (as many as the permits the holders were admitted
-- under) get 'to:<id>' as after a release (queue.lua, after sem_admit.lua).
local wants = {'string', 'zset', 'zset', 'zset', 'string', 'hash', 'hash'}
for i, want in ipairs(wants) do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'none' and t ~= want then return {-1, i} end
end
local under = tonumber(redis.call('GET', KEYS[1]) or '1') or 1
local before = admissible(under)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local evicted = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
local token, refused = fence_if_evicted(evicted > 0, KEYS[5], t, ARGV[2])
if not token then return {refused, 0} end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[6])
purge_dead(now)
if KEYS[8] then kind_keep(KEYS[8], 'distlock:semaphore', nil) end
wake_newly(before, admissible(under), ARGV[1], '')
return {evicted, token}
