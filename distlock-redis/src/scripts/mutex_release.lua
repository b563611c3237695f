-- Release a distlock mutex (the plain one): compare-and-delete, then hand
-- over to the next waiting provider, if anyone waits.
-- Prefixed with holds.lua, queue.lua (the fair purge) and line_pop.lua.
-- KEYS[1] lock key, KEYS[2] fair queue, KEYS[3] fair queue deadlines,
-- KEYS[4] holder record of earlier versions (unused: this version writes
-- none; an earlier version's holder deletes its own), KEYS[5] fair
-- waiters' owners (as release.lua: fair waiters of the same name go first),
-- KEYS[6] the waiting providers ({lock key}:waiting, zset provider id ->
-- place), KEYS[7] the hand-over reservation of earlier versions (unused:
-- this version reserves in the lock key), KEYS[8] the line's liveness
-- ({lock key}:waiting:alive, see line_pop.lua), KEYS[9] the listeners
-- ({lock key}:listening, see acquire.lua)
-- ARGV[1] the lock's value, ARGV[2] release channel, ARGV[3] reservation
-- TTL in ms
-- Returns 1 when released, 0 when the lock is not ours (nothing changed).
-- Nobody waits (no fair queue, no line, no listener: one EXISTS): the
-- lock key is deleted, three calls in all. Else the hand-over: 'to:<id>'
-- of the first live fair waiter; else the first live waiting provider is
-- taken off the line (dead ones are dropped), the lock key is set to its
-- reservation (holds.lua) for ARGV[3] ms and 'to:<provider id>' wakes one
-- waiter there (one wake-up per release across all providers); else
-- 'released' (one plain waiter of each provider that listens wakes, as for
-- clients that do not queue). The reservation overwrites our value, which
-- no one sees in between (scripts run atomically): the key is deleted only
-- when it is left free.
local value = redis.pcall('GET', KEYS[1])
if value ~= ARGV[1] then
  return 0
end
if redis.call('EXISTS', KEYS[2], KEYS[6], KEYS[9]) == 0 then
  redis.call('DEL', KEYS[1])
  return 1
end
local head = nil
if redis.call('TYPE', KEYS[2])['ok'] == 'zset'
    and redis.call('TYPE', KEYS[3])['ok'] == 'zset' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  fair_drop_dead(KEYS[2], KEYS[3], KEYS[5], now)
  head = fair_head(KEYS[2], KEYS[3], KEYS[5])
end
if head then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'to:' .. head)
  return 1
end
local nxt = pop_live(KEYS[6], KEYS[8])
if nxt then
  redis.call('SET', KEYS[1], HANDOFF_PREFIX .. nxt, 'PX', ARGV[3])
  redis.call('PUBLISH', ARGV[2], 'to:' .. nxt)
else
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
end
return 1
