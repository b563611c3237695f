-- Acquire one master's part of a Redlock: SET NX PX and, on success, the
-- next value of this master's fencing counter.
-- KEYS[1] lock key (prefix + name), KEYS[2] fencing counter
--         ({lock key}:redlock:fence), KEYS[3] (optional) holder record
--         ({lock key}:holder, as the single-master mutex's: a hash of
--         lock = ARGV[1], fence = c, at = the server's TIME in ms, owner =
--         ARGV[3], with the lock's TTL), for inspect
-- ARGV[1] owner token, ARGV[2] TTL in milliseconds, ARGV[3] owner identity,
-- ARGV[4] the fencing counter's TTL in milliseconds (the lease's TTL and the
--         fence retention, RedisOptions::fence_retention; set on the counter
--         whenever the lock is taken, so a name left unused leaves no key)
-- Returns {1, c}  when the lock was taken: c = max(counter + 1, floor), where
--                 floor = the server's TIME in whole seconds * 1000000; c is
--                 stored in the counter (atomically with taking the lock),
--         {0, remaining PTTL of the holder} when held by someone else,
--         {2, 0}  when the lock already holds ARGV[1] (this attempt ran
--                 before: a client resent it after a lost reply),
--         {-1, 0} when the lock key holds a value that is not a string,
--         {-2, 0} when the fencing counter is not an integer,
--         {-3, 0} when the fencing counter is exhausted (2^53: Lua numbers
--                 are doubles, exact only below it).
-- The counter is taken with INCR (then raised to the floor if below it):
-- one call fewer than GET + SET in the steady state. Nothing is left changed
-- unless the lock is taken, except an exhausted counter, which INCR has
-- pushed further past 2^53.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local c = redis.pcall('INCR', KEYS[2])
  if type(c) == 'table' then
    redis.call('DEL', KEYS[1])
    if string.find(c['err'] or '', 'overflow', 1, true) then
      return {-3, 0}
    end
    return {-2, 0}
  end
  local now = redis.call('TIME')
  local floor = tonumber(now[1]) * 1000000
  if c < floor then
    redis.call('SET', KEYS[2], string.format('%.0f', floor))
    c = floor
  end
  if c >= 9007199254740992 then
    redis.call('DEL', KEYS[1])
    return {-3, 0}
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  if KEYS[3] then
    local at = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    redis.call('DEL', KEYS[3])
    redis.call('HSET', KEYS[3], 'lock', ARGV[1], 'fence', string.format('%.0f', c),
      'at', string.format('%.0f', at), 'owner', ARGV[3] or '')
    redis.call('PEXPIRE', KEYS[3], ARGV[2])
  end
  return {1, c}
end
if redis.call('TYPE', KEYS[1])['ok'] ~= 'string' then
  return {-1, 0}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return {2, 0}
end
return {0, redis.call('PTTL', KEYS[1])}
