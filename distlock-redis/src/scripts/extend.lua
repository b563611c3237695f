-- Extend a distlock mutex: set its TTL only if it still holds our token
-- (redis-py's LUA_EXTEND_SCRIPT semantics with replace_ttl).
-- KEYS[1] lock key; KEYS[2] the fencing counter ({lock key}:fence), its
--         TTL set to ARGV[3] when given (fence.lua); KEYS[3] (optional) an election's leader record: a key
--         that lives and dies with the lock, given the same TTL; KEYS[4]
--         (optional) the election's kind marker (kind.lua), given the same
--         TTL while it holds 'distlock:election'
-- ARGV[1] the lock's value, ARGV[2] new TTL in milliseconds, ARGV[3]
-- (optional) the fencing counter's TTL in ms (the lease's and the fence
-- retention)
-- Returns 1 when extended, 0 when the lock is not ours (nothing changed).
local value = redis.pcall('GET', KEYS[1])
if value ~= ARGV[1] then
  return 0
end
if ARGV[3] then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
if KEYS[3] then
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
if KEYS[4] and redis.pcall('GET', KEYS[4]) == 'distlock:election' then
  redis.call('PEXPIRE', KEYS[4], ARGV[2])
end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
