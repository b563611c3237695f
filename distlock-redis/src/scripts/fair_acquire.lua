-- Acquire a distlock fair mutex (or win an election): take the lock when it
-- is free and nobody alive queues ahead, else queue (or keep our place).
-- Prefixed with holds.lua, kind.lua, fence.lua and queue.lua (the purge).
-- KEYS[1] lock key (the plain mutex's: prefix + name), KEYS[2] fencing
--         counter, KEYS[3] queue (zset waiter id -> arrival number),
--         KEYS[4] queue deadlines (zset waiter id -> expiry in server ms),
--         KEYS[5] the holder record of earlier versions (unused: the lock's
--         value is this version's, see holds.lua), KEYS[6] waiters'
--         owners (hash waiter id -> owner identity, expiring with the queue),
--         KEYS[7] (optional) leader record, set to '<token> <ARGV[7]>' with
--         the lock's TTL on success (elections), KEYS[8] (optional, with
--         KEYS[7]) the mutex's lock key of the election's name: the kind
--         check, and the election's marker while it has a leader (kind.lua)
-- ARGV[1] waiter id, ARGV[2] the lock's value ('<token>|<owner>',
-- holds.lua), ARGV[3] lock TTL in ms,
-- ARGV[4] queue entry TTL in ms, ARGV[5] '1' to queue when not acquired
--         ('0': try once, leave no entry), ARGV[6] channel (with KEYS[5]:
--         'elected' is published there on success), ARGV[7] candidate id,
-- ARGV[8] owner identity, ARGV[9] the fencing counter's TTL in ms (the
-- lease's and the fence retention)
-- Returns {1, fencing token} when acquired (our queue entry is gone),
--         {0, wait ms, position, queued} when not: wait ms is the holder's
--                 PTTL (-1: no TTL), or when the lock is free but a waiter
--                 queues ahead, the time until that waiter's entry expires;
--                 position is our 0-based place (-1: not queued); queued is
--                 1 when this call added our entry (first call, or our
--                 entry had expired), 0 when it only refreshed it,
--         {2, 0} when the lock already holds ARGV[2] (a resent attempt),
--         {-1, 0} lock key not a string, {-2, 0} fencing counter not an
--         integer, {-3, 0} fencing counter exhausted (2^53),
--         {-4, 0} a queue key that is not a sorted set (or the owners key
--                 not a hash),
--         {-5, kind} another kind holds the name (kind.lua's kind_other:
--                 1..3 a marker in the lock key, 4 a mutex token for an
--                 election, 5 not a string); nothing changed.
-- Entries that were not refreshed within their TTL are dropped first: a dead
-- waiter holds up the queue only until its own entry expires, never more
-- (entries expire side by side, not one after another). Both queue keys
-- expire with their last entry, so nothing outlives the waiters.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lock_type = redis.call('TYPE', KEYS[1])['ok']
if lock_type ~= 'none' and lock_type ~= 'string' then
  return {-1, 0}
end
for i = 3, 4 do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  if kind ~= 'none' and kind ~= 'zset' then
    return {-4, 0}
  end
end
local owners_type = redis.call('TYPE', KEYS[6])['ok']
if owners_type ~= 'none' and owners_type ~= 'hash' then
  return {-4, 0}
end
if KEYS[8] then
  local other = kind_other(KEYS[8], 'distlock:election')
  if other ~= 0 then return {-5, other} end
end
fair_drop_dead(KEYS[3], KEYS[4], KEYS[6], now)
local holder = redis.call('GET', KEYS[1])
-- A plain mutex's hand-over reservation binds plain waiters only: free.
if reserved_for(holder) then
  holder = false
end
if holder == ARGV[2] then
  return {2, 0}
end
if holder and KIND_MARKERS[holder] then
  return {-5, KIND_MARKERS[holder]}
end
local head = fair_head(KEYS[3], KEYS[4], KEYS[6])
if not holder and (head == nil or head == ARGV[1]) then
  local token, refused = fence_next(KEYS[2], t, ARGV[9])
  if not token then
    return {refused, 0}
  end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('HDEL', KEYS[6], ARGV[1])
  if KEYS[7] then
    redis.call('SET', KEYS[7], string.format('%.0f', token) .. ' ' .. ARGV[7], 'PX', ARGV[3])
    redis.call('PUBLISH', ARGV[6], 'elected')
    if KEYS[8] then
      kind_keep(KEYS[8], 'distlock:election', now + tonumber(ARGV[3]))
    end
  end
  return {1, token}
end
local wait = -1
if holder then
  wait = redis.call('PTTL', KEYS[1])
else
  local expiry = redis.call('ZSCORE', KEYS[4], head)
  wait = math.max(0, tonumber(expiry) - now)
end
if ARGV[5] ~= '1' then
  return {0, wait, -1, 0}
end
local queued = 0
if not redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  local arrival = 0
  if last[2] then
    arrival = tonumber(last[2]) + 1
  end
  redis.call('ZADD', KEYS[3], arrival, ARGV[1])
  queued = 1
end
redis.call('ZADD', KEYS[4], now + tonumber(ARGV[4]), ARGV[1])
redis.call('HSET', KEYS[6], ARGV[1], ARGV[8])
local latest = tonumber(redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2])
redis.call('PEXPIREAT', KEYS[3], latest)
redis.call('PEXPIREAT', KEYS[4], latest)
redis.call('PEXPIREAT', KEYS[6], latest)
return {0, wait, redis.call('ZRANK', KEYS[3], ARGV[1]), queued}
