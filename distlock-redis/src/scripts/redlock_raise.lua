-- Write a Redlock fencing token back to one master: raise its fencing
-- counter to ARGV[2], only while the lock still holds our token.
-- KEYS[1] lock key, KEYS[2] fencing counter ({lock key}:redlock:fence)
-- ARGV[1] owner token, ARGV[2] the token T (an integer below 2^53),
-- ARGV[3] the fencing counter's TTL in milliseconds (as redlock_acquire.lua)
-- Returns 1 when the lock is ours and the counter now holds at least T,
--         0 when the lock is not ours (nothing changed),
--         -2 when the fencing counter is not an integer (nothing changed).
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local raw = redis.call('GET', KEYS[2])
local c = 0
if raw then
  c = tonumber(raw)
  if c == nil or c ~= math.floor(c) then
    return -2
  end
end
if c < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
return 1
