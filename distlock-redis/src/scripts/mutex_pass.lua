-- A provider leaves the line of a plain mutex (its last waiter gave up, or
-- a release woke it when none of its waiters waited any more): it is taken
-- off the line and, if the lock is free and not reserved for another, the
-- next provider in line gets the lock reserved and is woken (or, nobody in
-- line, the lock is announced free): the wake-up this provider did not use
-- goes on.
-- KEYS[1] lock key, KEYS[2] the waiting providers, KEYS[3] the reservation,
-- KEYS[4] the line's liveness (see line_pop.lua)
-- ARGV[1] this provider's id, ARGV[2] release channel, ARGV[3] reservation
-- TTL in ms
-- Returns 1 when it passed the lock on, 0 otherwise.
redis.pcall('ZREM', KEYS[2], ARGV[1])
redis.pcall('ZREM', KEYS[4], ARGV[1])
local reserved = redis.call('GET', KEYS[3])
if reserved and reserved ~= ARGV[1] then
  -- Reserved for another, who was woken.
  return 0
end
if reserved then
  redis.call('DEL', KEYS[3])
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  -- Held: its release wakes the next.
  return 0
end
local first = pop_live(KEYS[2], KEYS[4])
if first then
  redis.call('SET', KEYS[3], first, 'PX', ARGV[3])
  redis.call('PUBLISH', ARGV[2], 'to:' .. first)
else
  redis.call('PUBLISH', ARGV[2], 'released')
end
return 1
