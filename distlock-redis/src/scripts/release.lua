-- Release a distlock mutex: delete the lock key only if it still holds our
-- token (redis-py's LUA_RELEASE_SCRIPT semantics), then hand over.
-- Prefixed with queue.lua (the fair purge).
-- KEYS[1] lock key, KEYS[2] fair queue ({…}:fair:queue, zset waiter id ->
--         arrival), KEYS[3] fair queue deadlines ({…}:fair:timeouts, zset
--         waiter id -> expiry in server ms), KEYS[4] the holder record of
--         earlier versions (unused: this version's hold is its own record,
--         see holds.lua; an earlier version's holder deletes its own),
--         KEYS[5] fair waiters' owners (hash waiter id -> owner identity),
--         KEYS[6] (optional) an election's leader record, KEYS[7]
--         (optional) the election's kind marker (the mutex's lock key of its
--         name, deleted when it holds 'distlock:election'; see kind.lua)
-- ARGV[1] owner token, ARGV[2] release channel
-- Returns 1 when released, 0 when the lock is not ours (nothing changed).
-- The hand-over: the queue's expired entries are dropped, then the message
-- on the channel is 'to:<id>' of the first live fair waiter (exactly that
-- waiter wakes), or 'released' when nobody queues (one plain waiter of each
-- provider wakes). A queue key of another type is left alone. Called with
-- KEYS[1] only, it is the plain compare-and-delete with 'released'.
local value = redis.pcall('GET', KEYS[1])
if value ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if KEYS[6] then
  redis.call('DEL', KEYS[6])
end
if KEYS[7] and redis.pcall('GET', KEYS[7]) == 'distlock:election' then
  redis.call('DEL', KEYS[7])
end
local head = nil
if KEYS[3] and redis.call('EXISTS', KEYS[2]) == 1
    and redis.call('TYPE', KEYS[2])['ok'] == 'zset'
    and redis.call('TYPE', KEYS[3])['ok'] == 'zset' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  fair_drop_dead(KEYS[2], KEYS[3], KEYS[5], now)
  head = fair_head(KEYS[2], KEYS[3], KEYS[5])
end
if head then
  redis.call('PUBLISH', ARGV[2], 'to:' .. head)
else
  redis.call('PUBLISH', ARGV[2], 'released')
end
return 1
