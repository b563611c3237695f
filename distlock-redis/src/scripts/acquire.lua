-- Acquire a distlock mutex: SET NX PX and, on success, INCR the fencing counter.
-- KEYS[1] lock key (prefix + name), KEYS[2] fencing counter ({lock key}:fence)
-- ARGV[1] owner token, ARGV[2] TTL in milliseconds
-- Returns {1, fencing token} when acquired,
--         {0, remaining PTTL of the holder} when held by someone else,
--         {-1, 0} when the lock key holds a value that is not a string,
--         {-2, 0} when the fencing counter is not an integer below 2^63 - 1.
-- Nothing is left changed unless the lock is acquired (scripts run atomically,
-- so undoing the SET is invisible to everyone else).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local token = redis.pcall('INCR', KEYS[2])
  if type(token) == 'table' then
    redis.call('DEL', KEYS[1])
    return {-2, 0}
  end
  return {1, token}
end
if redis.call('TYPE', KEYS[1])['ok'] ~= 'string' then
  return {-1, 0}
end
return {0, redis.call('PTTL', KEYS[1])}
