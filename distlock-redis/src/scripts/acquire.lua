-- Acquire a distlock mutex: SET NX PX and, on success, the next fencing token.
-- KEYS[1] lock key (prefix + name), KEYS[2] fencing counter ({lock key}:fence),
-- KEYS[3] (optional) holder record ({lock key}:holder, hash: lock = the lock's value,
--         fence, at = acquired at in server ms, owner = owner identity;
--         same TTL as the lock key)
-- ARGV[1] attempt token (the lock's value), ARGV[2] TTL in milliseconds,
-- ARGV[3] owner identity
-- Returns {1, fencing token} when acquired,
--         {0, remaining PTTL of the holder} when held by someone else,
--         {2, 0} when the lock already holds ARGV[1]: this very attempt ran
--                before (a client resent it after a lost reply), so its
--                fencing token is unknown; the caller releases and retries,
--         {-1, 0} when the lock key holds a value that is not a string,
--         {-2, 0} when the fencing counter is not an integer,
--         {-3, 0} when the fencing counter is exhausted (2^53: Lua numbers
--                 are doubles, exact only below it).
-- The token is INCR of the counter, raised to the server's TIME in
-- microseconds when the counter is below it (and stored): tokens keep
-- increasing when the counter is lost (restart without persistence,
-- eviction, failover to a replica that missed the last INCR), as long as the
-- server's clock does not step back.
-- Nothing is left changed unless the lock is acquired (scripts run atomically,
-- so undoing the SET is invisible to everyone else).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local token = redis.pcall('INCR', KEYS[2])
  if type(token) == 'table' then
    redis.call('DEL', KEYS[1])
    if string.find(token['err'] or '', 'overflow', 1, true) then
      return {-3, 0}
    end
    return {-2, 0}
  end
  local now = redis.call('TIME')
  local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
  if token < floor then
    redis.call('SET', KEYS[2], string.format('%.0f', floor))
    token = floor
  end
  if token >= 9007199254740992 then
    redis.call('DEL', KEYS[1])
    return {-3, 0}
  end
  if KEYS[3] then
    local at = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    redis.call('DEL', KEYS[3])
    redis.call('HSET', KEYS[3], 'lock', ARGV[1], 'fence', string.format('%.0f', token),
      'at', string.format('%.0f', at), 'owner', ARGV[3] or '')
    redis.call('PEXPIRE', KEYS[3], ARGV[2])
  end
  return {1, token}
end
if redis.call('TYPE', KEYS[1])['ok'] ~= 'string' then
  return {-1, 0}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return {2, 0}
end
return {0, redis.call('PTTL', KEYS[1])}
