-- Extend a semaphore permit: only if the token still holds it.
-- KEYS as sem_acquire.lua (KEYS[8]: the kind marker, kept as long as the
-- permits); ARGV[1] token, ARGV[2] new TTL ms, ARGV[3] (unused, the
-- read-write lock's side), ARGV[4] the fencing counter's TTL in ms (KEYS[5];
-- the lease's and the fence retention)
-- KEYS[9] the requests to release ({lock}:sem:revoke, hash token -> 1,
-- request_release.lua)
-- Returns 1 when extended, 3 when extended and someone asked this permit to
-- release (the request is kept as long as the permit), 0 when the permit
-- is not ours (nothing changed).
-- The permits key and the holder records expire with the last holder.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  for _, token in ipairs(gone) do redis.pcall('HDEL', KEYS[6], token) end
end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[2], 'XX', now + tonumber(ARGV[2]), ARGV[1])
local top = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
local at = string.format('%.0f', tonumber(top[2]) + 1)
redis.call('PEXPIREAT', KEYS[2], at)
redis.call('PEXPIREAT', KEYS[1], at)
redis.pcall('PEXPIREAT', KEYS[6], at)
redis.call('PEXPIRE', KEYS[5], ARGV[4])
kind_keep(KEYS[8], 'distlock:semaphore', kind_latest(now, KEYS[2]))
return asked(KEYS[9], ARGV[1], ARGV[2])
