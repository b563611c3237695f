-- A provider leaves the line of a plain mutex (its last waiter gave up, or
-- a release woke it when none of its waiters waited any more): it is taken
-- off the line and, if the lock is reserved for it, the reservation goes to
-- the next provider in line (or, nobody in line, the lock is announced
-- free).
-- KEYS[1] lock key, KEYS[2] the waiting providers, KEYS[3] the reservation
-- ARGV[1] this provider's id, ARGV[2] release channel, ARGV[3] reservation
-- TTL in ms
-- Returns 1 when it passed a reservation on, 0 otherwise.
redis.pcall('ZREM', KEYS[2], ARGV[1])
if redis.call('GET', KEYS[3]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[3])
if redis.call('EXISTS', KEYS[1]) == 1 then
  -- Taken meanwhile (by a client that ignores reservations): its release
  -- wakes the next.
  return 1
end
local nxt = redis.pcall('ZPOPMIN', KEYS[2])
if type(nxt) == 'table' and nxt[1] then
  redis.call('SET', KEYS[3], nxt[1], 'PX', ARGV[3])
  redis.call('PUBLISH', ARGV[2], 'to:' .. nxt[1])
else
  redis.call('PUBLISH', ARGV[2], 'released')
end
return 1
