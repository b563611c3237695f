-- Leave a distlock fair queue (a cancelled or timed-out waiter, or the undo
-- of an attempt whose reply was lost), handing over if that frees the way.
-- Prefixed with queue.lua (the fair purge).
-- KEYS[1] lock key, KEYS[2] queue, KEYS[3] queue deadlines,
--         KEYS[4] holder record, KEYS[5] waiters' owners (hash),
--         KEYS[6] (optional) leader record (elections)
-- ARGV[1] waiter id, ARGV[2] owner token of the attempt ('' for none),
-- ARGV[3] channel
-- Returns 1 when the lock held ARGV[2] and was released, else 0.
-- The lock is deleted only if it holds ARGV[2]. When the lock is then free
-- and we were first in the queue (or we just released the lock), the next
-- live waiter is woken with 'to:<id>' (or 'released' if we released the
-- lock and nobody queues). Leaving twice is harmless.
local released = 0
if ARGV[2] ~= '' and redis.pcall('GET', KEYS[1]) == ARGV[2] then
  redis.call('DEL', KEYS[1])
  redis.call('DEL', KEYS[4])
  if KEYS[6] then
    redis.call('DEL', KEYS[6])
  end
  released = 1
end
if redis.call('TYPE', KEYS[2])['ok'] ~= 'zset' or redis.call('TYPE', KEYS[3])['ok'] ~= 'zset' then
  if released == 1 then
    redis.call('PUBLISH', ARGV[3], 'released')
  end
  return released
end
local was_head = redis.call('ZRANGE', KEYS[2], 0, 0)[1] == ARGV[1]
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.pcall('HDEL', KEYS[5], ARGV[1])
if (released == 1 or was_head) and redis.call('EXISTS', KEYS[1]) == 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  fair_drop_dead(KEYS[2], KEYS[3], KEYS[5], now)
  local head = fair_head(KEYS[2], KEYS[3], KEYS[5])
  if head then
    redis.call('PUBLISH', ARGV[3], 'to:' .. head)
  elseif released == 1 then
    redis.call('PUBLISH', ARGV[3], 'released')
  end
end
return released
