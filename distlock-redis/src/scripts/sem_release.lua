-- Release a semaphore permit and/or leave the waiting queue.
-- KEYS as sem_acquire.lua (KEYS[8]: the kind marker, kept for the permits
-- left or deleted with the last); ARGV[1] token of the permit ('' for none),
-- ARGV[2] waiter to take out of the queue ('' for none), ARGV[3] the release
-- channel ({lock}:sem:released), ARGV[4] the caller's number of permits
-- Returns 1 when the permit was ours and is released, 0 otherwise.
-- Expired holders and dead waiters are purged first; the permits key goes
-- with the last holder. Wake-ups: every queued waiter that may get in now
-- and could not before this call (a permit was freed or expired, a waiter
-- ahead left or died) gets 'to:<its id>' on the channel (queue.lua, after sem_admit.lua): one
-- message per freed place; a waiter that leaves while it could have got in
-- hands over to the one that now can.
local permits = tonumber(ARGV[4]) or 1
local before = admissible(permits)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
purge_expired(now)
purge_dead(now)
local released = 0
if ARGV[1] ~= '' then
  released = redis.call('ZREM', KEYS[2], ARGV[1])
  if released == 1 then redis.pcall('HDEL', KEYS[6], ARGV[1]) end
end
if redis.call('ZCARD', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[1])
  redis.call('DEL', KEYS[6])
end
if ARGV[2] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[2])
  redis.call('ZREM', KEYS[4], ARGV[2])
  redis.pcall('HDEL', KEYS[7], ARGV[2])
end
kind_keep(KEYS[8], 'distlock:semaphore', kind_latest(now, KEYS[2]))
wake_newly(before, admissible(permits), ARGV[3], '')
return released
