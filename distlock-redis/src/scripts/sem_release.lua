-- Release a semaphore permit and/or leave the waiting queue.
-- KEYS as sem_acquire.lua; ARGV[1] token of the permit ('' for none),
-- ARGV[2] waiter to take out of the queue ('' for none), ARGV[3] the release
-- channel ({lock}:sem:released)
-- Returns 1 when the permit was ours and is released, 0 otherwise.
-- Publishes on the channel when a permit was freed or a queued waiter left
-- (those behind it move up); the permits key goes with the last holder.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local released = 0
if ARGV[1] ~= '' then
  released = redis.call('ZREM', KEYS[2], ARGV[1])
end
if redis.call('ZCARD', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[1])
end
local left = 0
if ARGV[2] ~= '' then
  left = redis.call('ZREM', KEYS[3], ARGV[2])
  redis.call('ZREM', KEYS[4], ARGV[2])
end
if released == 1 or left == 1 then
  redis.call('PUBLISH', ARGV[3], 'released')
end
return released
