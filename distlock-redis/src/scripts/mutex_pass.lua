-- A provider leaves the line of a plain mutex (its last waiter gave up, or
-- a release woke it when none of its waiters waited any more): it is taken
-- off the line and, if the lock is free (or reserved for this provider),
-- the next provider in line gets the lock reserved and is woken (or,
-- nobody in line, the lock is announced free): the wake-up this provider
-- did not use goes on (to a member of an earlier version's line as that
-- version reserves, see mutex_release.lua). Prefixed with holds.lua and line_pop.lua.
-- KEYS[1] lock key, KEYS[2] the waiting providers, KEYS[3] the reservation
-- of earlier versions ({lock key}:handoff: one for this provider is
-- passed on as this version's), KEYS[4] the line's liveness (see
-- line_pop.lua), KEYS[5] (optional) the listeners (see acquire.lua)
-- ARGV[1] this provider's id, ARGV[2] release channel, ARGV[3] reservation
-- TTL in ms
-- Returns 1 when it passed the lock on, 0 otherwise.
redis.pcall('ZREM', KEYS[2], ARGV[1])
redis.pcall('ZREM', KEYS[4], ARGV[1])
if KEYS[5] then redis.pcall('ZREM', KEYS[5], ARGV[1]) end
local value = redis.pcall('GET', KEYS[1])
if type(value) == 'table' then return 0 end
if value and reserved_for(value) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  value = false
end
if value then
  -- Held (its release wakes the next), or reserved for another (woken).
  return 0
end
local reserved = redis.pcall('GET', KEYS[3])
if type(reserved) == 'string' then
  if reserved ~= ARGV[1] then
    -- An earlier version's release reserved it for another, who was woken.
    return 0
  end
  redis.call('DEL', KEYS[3])
end
local first, earlier = pop_live(KEYS[2], KEYS[4])
if first and earlier then
  -- A provider of an earlier version: reserved its way (the key stays free).
  redis.call('SET', KEYS[3], first, 'PX', ARGV[3])
  redis.call('PUBLISH', ARGV[2], 'to:' .. first)
elseif first then
  redis.call('SET', KEYS[1], HANDOFF_PREFIX .. first, 'PX', ARGV[3])
  redis.call('PUBLISH', ARGV[2], 'to:' .. first)
else
  redis.call('PUBLISH', ARGV[2], 'released')
end
return 1
