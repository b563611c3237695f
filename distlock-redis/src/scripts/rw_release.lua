-- Release a read-write lock hold and/or leave its waiting queue.
-- KEYS as rw_acquire.lua (KEYS[8]: the kind marker, kept for the holds
-- left or deleted with the last); ARGV[1] token of the hold ('' for none),
-- ARGV[2] waiter to take out of the queue ('' for none), ARGV[3] the release
-- channel ({lock}:rw:released), ARGV[4] 'r' or 'w'
-- Returns 1 when the hold was ours and is released, 0 otherwise.
-- Expired readers and dead waiters are purged first. Wake-ups: every queued
-- waiter that may get in now and could not before this call (the writer
-- left, the last reader left, a waiter ahead left or died) gets
-- 'to:<its id>' on the channel (queue.lua, after rw_admit.lua): a writer's release wakes the
-- run of readers at the head of the queue, one message each; a waiter that
-- leaves while it could have got in hands over to whoever may now.
local before = admissible()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
purge_expired(now)
purge_dead(now)
local released = 0
if ARGV[1] ~= '' then
  if ARGV[4] == 'w' then
    if redis.pcall('GET', KEYS[1]) == ARGV[1] then
      redis.call('DEL', KEYS[1])
      redis.pcall('HDEL', KEYS[6], 'w')
      released = 1
    end
  else
    released = redis.call('ZREM', KEYS[2], ARGV[1])
    if released == 1 then redis.pcall('HDEL', KEYS[6], ARGV[1]) end
  end
end
if ARGV[2] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[2])
  redis.call('ZREM', KEYS[4], ARGV[2])
  redis.pcall('HDEL', KEYS[7], ARGV[2])
end
kind_keep(KEYS[8], 'distlock:rw', kind_latest(now, KEYS[2], KEYS[1]))
wake_newly(before, admissible(), ARGV[3], '')
return released
