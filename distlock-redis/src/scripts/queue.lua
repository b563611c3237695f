-- The queue library (a prelude: defines functions only, no server call
-- until one is called).
-- First the fair queue's purge, for every script of the fair mutex and the
-- election that reads the queue's head (fair_acquire.lua, release.lua,
-- fair_leave.lua, mutex_release.lua, force_lock.lua); its keys are
-- arguments: `queue` (zset waiter id -> arrival), `deadlines` (zset waiter
-- id -> expiry in server ms), `owners` (hash waiter id -> owner identity).
-- Drops the waiters whose entry was not refreshed by `now` (server ms): a
-- dead waiter holds up the queue only until its own entry expires.
local function fair_drop_dead(queue, deadlines, owners, now)
  for _, dead in ipairs(redis.call('ZRANGEBYSCORE', deadlines, '-inf', now)) do
    redis.call('ZREM', queue, dead)
    redis.call('ZREM', deadlines, dead)
    redis.pcall('HDEL', owners, dead)
  end
end
-- The first waiter of the queue, after dropping from its front the entries
-- without a deadline (their deadline key expired first, or was changed by
-- hand: they could never expire); nil when nobody queues.
local function fair_head(queue, deadlines, owners)
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  while head and not redis.call('ZSCORE', deadlines, head) do
    redis.call('ZREM', queue, head)
    redis.pcall('HDEL', owners, head)
    head = redis.call('ZRANGE', queue, 0, 0)[1]
  end
  return head
end
-- Then the read-write lock's and the semaphore's, after their admission
-- rule (rw_admit.lua or sem_admit.lua, which define admissible()). KEYS as
-- rw_acquire.lua / sem_acquire.lua: KEYS[2] the holders, KEYS[3] the queue,
-- KEYS[4] its entries' expiry, KEYS[6] the holder records, KEYS[7] the
-- waiters' owners.
-- Publishes 'to:<id>' on the channel for every waiter in `after` that was not
-- in `before` (nor `me`, the caller): one wake-up per waiter that this script
-- let in, addressed to it, whichever provider it waits on.
local function wake_newly(before, after, channel, me)
  local was = {}
  for _, m in ipairs(before) do was[m] = true end
  for _, m in ipairs(after) do
    if not was[m] and m ~= me then
      redis.call('PUBLISH', channel, 'to:' .. m)
    end
  end
end
-- Drops dead waiters (entries not refreshed in time) from the queue.
local function purge_dead(now)
  if redis.call('TYPE', KEYS[4])['ok'] ~= 'zset'
      or redis.call('TYPE', KEYS[3])['ok'] ~= 'zset' then
    return
  end
  for _, dead in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)) do
    redis.call('ZREM', KEYS[3], dead)
    redis.call('ZREM', KEYS[4], dead)
    redis.pcall('HDEL', KEYS[7], dead)
  end
end
-- Drops the holders whose lease expired (score at or before `now`) from
-- the holders zset (KEYS[2]) and their records from KEYS[6].
local function purge_expired(now)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
  if #gone == 0 then return end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  for _, token in ipairs(gone) do
    redis.pcall('HDEL', KEYS[6], token)
  end
end
-- Sets `key` to expire at `at` (server ms) unless it already lives longer.
local function stretch(key, at, now)
  local left = redis.call('PTTL', key)
  if left == -2 then return end
  if left == -1 or now + left < at then
    redis.call('PEXPIREAT', key, string.format('%.0f', at))
  end
end
