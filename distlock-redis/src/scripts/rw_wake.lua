-- Prepended to rw_acquire.lua and rw_release.lua: who may get in, and the
-- wake-ups, and the purges. KEYS as rw_acquire.lua.
-- The waiters an attempt would admit right now, in queue order: nobody while
-- a writer holds; else the head of the queue if it is a writer and no reader
-- holds; else the run of readers at the head of the queue (up to the first
-- queued writer). Computed on the keys as they stand (expired holders and
-- dead waiters count until purged). Nobody when the queue is not a sorted set.
local function admissible()
  if redis.call('TYPE', KEYS[3])['ok'] ~= 'zset' then return {} end
  if redis.call('EXISTS', KEYS[1]) == 1 then return {} end
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not head then return {} end
  if string.sub(head, 1, 2) == 'w:' then
    if redis.pcall('ZCARD', KEYS[2]) == 0 then return {head} end
    return {}
  end
  local run = {}
  local from = 0
  while true do
    local chunk = redis.call('ZRANGE', KEYS[3], from, from + 63)
    for _, m in ipairs(chunk) do
      if string.sub(m, 1, 2) ~= 'r:' then return run end
      run[#run + 1] = m
    end
    if #chunk < 64 then return run end
    from = from + 64
  end
end
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
