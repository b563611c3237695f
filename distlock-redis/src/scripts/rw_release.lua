-- Release a read-write lock hold and/or leave its waiting queue.
-- KEYS as rw_acquire.lua; ARGV[1] token of the hold ('' for none),
-- ARGV[2] waiter to take out of the queue ('' for none), ARGV[3] the release
-- channel ({lock}:rw:released), ARGV[4] 'r' or 'w'
-- Returns 1 when the hold was ours and is released, 0 otherwise.
-- Publishes on the channel when someone may now get in: the writer left, the
-- last reader left, or a queued waiter left (those behind it move up).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local released = 0
if ARGV[1] ~= '' then
  if ARGV[4] == 'w' then
    if redis.pcall('GET', KEYS[1]) == ARGV[1] then
      redis.call('DEL', KEYS[1])
      released = 1
    end
  else
    released = redis.call('ZREM', KEYS[2], ARGV[1])
  end
end
local left = 0
if ARGV[2] ~= '' then
  left = redis.call('ZREM', KEYS[3], ARGV[2])
  redis.call('ZREM', KEYS[4], ARGV[2])
end
if left == 1 or (released == 1 and (ARGV[4] == 'w' or redis.call('ZCARD', KEYS[2]) == 0)) then
  redis.call('PUBLISH', ARGV[3], 'released')
end
return released
