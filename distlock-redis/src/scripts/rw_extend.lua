-- Extend a read-write lock hold: only if the token still holds.
-- KEYS as rw_acquire.lua (KEYS[8]: the kind marker, kept as long as the
-- holds); ARGV[1] token, ARGV[2] new TTL ms, ARGV[3] 'r'/'w', ARGV[4] the
-- fencing counter's TTL in ms (KEYS[5]; the lease's and the fence retention)
-- KEYS[9] the requests to release ({lock}:rw:revoke, hash token -> 1,
-- request_release.lua)
-- Returns 1 when extended, 3 when extended and someone asked this hold to
-- release (the request is kept as long as the hold), 0 when the hold is
-- not ours (nothing changed).
-- The holder records (KEYS[6]) are kept at least as long as the hold.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function stretch(key, at)
  local left = redis.pcall('PTTL', key)
  if type(left) ~= 'number' or left == -2 then return end
  if left == -1 or now + left < at then
    redis.call('PEXPIREAT', key, string.format('%.0f', at))
  end
end
if ARGV[3] == 'w' then
  if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then return 0 end
  stretch(KEYS[6], now + tonumber(ARGV[2]))
  local extended = redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[5], ARGV[4])
  kind_keep(KEYS[8], 'distlock:rw', kind_latest(now, KEYS[2], KEYS[1]))
  if extended ~= 1 then return extended end
  return asked(KEYS[9], ARGV[1], ARGV[2])
end
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  for _, token in ipairs(gone) do redis.pcall('HDEL', KEYS[6], token) end
end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[2], 'XX', now + tonumber(ARGV[2]), ARGV[1])
local top = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[2], string.format('%.0f', tonumber(top[2]) + 1))
stretch(KEYS[6], now + tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[5], ARGV[4])
kind_keep(KEYS[8], 'distlock:rw', kind_latest(now, KEYS[2], KEYS[1]))
return asked(KEYS[9], ARGV[1], ARGV[2])
