-- The semaphore's admission rule (a prelude of its acquire, release and
-- force scripts, before queue.lua). KEYS as sem_acquire.lua.
-- The waiters an attempt would admit right now, in queue order: the first
-- (permits - holders) of the queue, permits being the number the holders
-- were admitted under (`permits`, the caller's, when nobody holds).
-- Computed on the keys as they stand (expired holders and dead waiters count
-- until purged). Nobody when the queue is not a sorted set.
local function admissible(permits)
  if redis.call('TYPE', KEYS[3])['ok'] ~= 'zset' then return {} end
  local held = redis.pcall('ZCARD', KEYS[2])
  if type(held) ~= 'number' then return {} end
  local under = permits
  if held > 0 then
    local stored = redis.pcall('GET', KEYS[1])
    if type(stored) == 'string' then under = tonumber(stored) or permits end
  end
  local room = under - held
  if room <= 0 then return {} end
  return redis.call('ZRANGE', KEYS[3], 0, room - 1)
end
