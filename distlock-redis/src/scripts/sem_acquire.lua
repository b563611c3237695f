-- Acquire a permit of a distlock semaphore (FIFO among the waiters that
-- announced themselves).
-- KEYS[1] permits ({lock}:sem:permits, the number the holders were admitted
--         under; kept while holders exist)
-- KEYS[2] holders ({lock}:sem:holders, zset token -> expiry in server ms)
-- KEYS[3] queue ({lock}:sem:queue, zset waiter -> arrival in µs)
-- KEYS[4] alive ({lock}:sem:alive, zset waiter -> expiry of its entry, ms)
-- KEYS[5] fencing counter ({lock}:sem:fence)
-- KEYS[6] holder records ({lock}:sem:info, hash token -> '<fence> <at ms>
--         <owner>', expiring with the holders)
-- KEYS[7] waiters' owners ({lock}:sem:owners, hash waiter -> owner
--         identity, expiring with the queue)
-- ARGV[1] attempt token, ARGV[2] lease TTL ms, ARGV[3] waiter,
-- ARGV[4] '1' to queue up when not admitted, ARGV[5] queue entry TTL ms,
-- ARGV[6] permits asked, ARGV[7] the release channel ({lock}:sem:released),
-- ARGV[8] owner identity, ARGV[9] the fencing counter's TTL in ms (the
-- lease's and the fence retention)
-- KEYS[8] the mutex's lock key (prefix + name): the kind check (kind.lua)
-- Admission: holders + live waiters queued ahead < permits (a waiter not
-- queued counts every queued waiter as ahead).
-- Returns {1, fencing token}
--         {0, ms until the earliest expiry that may change the answer or -1}
--         {2, 0} the attempt token already holds (a resent attempt)
--         {-1, index of the key of the wrong type}
--         {-2, 0} the fencing counter is not an integer
--         {-3, 0} the fencing counter is exhausted (2^53)
--         {-4, permits held under} holders exist under another number of
--                  permits (nothing changed but the purge)
--         {-5, kind} another kind holds the name (kind.lua's kind_other:
--                  1..3 a marker, 4 a mutex token, 5 not a string); nothing
--                  changed
-- Expired holders and dead waiters (entries not refreshed) are purged first.
-- Wake-ups: every queued waiter this call lets in (a purge that freed
-- permits or unblocked the queue) gets 'to:<its id>' on the channel
-- (queue.lua, after sem_admit.lua). An admission itself lets nobody new in: with a permit
-- still free, the waiter behind was already let in (and woken).
local function typed(key, want)
  local t = redis.call('TYPE', key)['ok']
  return t == 'none' or t == want
end
if not typed(KEYS[1], 'string') then return {-1, 1} end
for i = 2, 4 do
  if not typed(KEYS[i], 'zset') then return {-1, i} end
end
for i = 6, 7 do
  if not typed(KEYS[i], 'hash') then return {-1, i} end
end
local other = kind_other(KEYS[8], 'distlock:semaphore')
if other ~= 0 then return {-5, other} end
local permits = tonumber(ARGV[6])
local before = admissible(permits)
local function attempt()
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  purge_expired(now)
  purge_dead(now)
  local function expire_with_last(zset, ...)
    local top = redis.call('ZRANGE', zset, -1, -1, 'WITHSCORES')
    if top[2] then
      local at = string.format('%.0f', tonumber(top[2]) + 1)
      redis.call('PEXPIREAT', zset, at)
      for _, other in ipairs({...}) do redis.call('PEXPIREAT', other, at) end
    end
  end
  local held = redis.call('ZCARD', KEYS[2])
  if held == 0 then
    redis.call('DEL', KEYS[1])
    redis.call('DEL', KEYS[6])
  elseif redis.call('ZSCORE', KEYS[2], ARGV[1]) then
    return {2, 0}
  end
  if held > 0 then
    local under = tonumber(redis.call('GET', KEYS[1]) or ARGV[6]) or permits
    if under ~= permits then return {-4, under} end
  end
  local rank = redis.call('ZRANK', KEYS[3], ARGV[3])
  local ahead = rank
  if rank == false then ahead = redis.call('ZCARD', KEYS[3]) end
  if held + ahead < permits then
    local token, refused = fence_next(KEYS[5], t, ARGV[9])
    if not token then return {refused, 0} end
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
    redis.call('SET', KEYS[1], ARGV[6])
    redis.call('HSET', KEYS[6], ARGV[1], string.format('%.0f', token) .. ' '
      .. string.format('%.0f', now) .. ' ' .. ARGV[8])
    expire_with_last(KEYS[2], KEYS[1], KEYS[6])
    kind_keep(KEYS[8], 'distlock:semaphore', kind_latest(now, KEYS[2]))
    if redis.call('ZREM', KEYS[3], ARGV[3]) == 1 then
      redis.call('ZREM', KEYS[4], ARGV[3])
    end
    redis.call('HDEL', KEYS[7], ARGV[3])
    return {1, token}
  end
  if ARGV[4] == '1' then
    redis.call('ZADD', KEYS[3], 'NX', now_us, ARGV[3])
    redis.call('ZADD', KEYS[4], now + tonumber(ARGV[5]), ARGV[3])
    redis.call('HSET', KEYS[7], ARGV[3], ARGV[8])
    expire_with_last(KEYS[4], KEYS[3], KEYS[7])
  end
  local recheck = -1
  local function consider(ms)
    if ms >= 0 and (recheck < 0 or ms < recheck) then recheck = ms end
  end
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if first[2] then consider(tonumber(first[2]) - now) end
  first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
  if first[2] then consider(tonumber(first[2]) - now) end
  return {0, recheck}
end
local reply = attempt()
wake_newly(before, admissible(permits), ARGV[7], ARGV[3])
return reply
