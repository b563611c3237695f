-- Extend a distlock mutex: set its TTL only if it still holds our token
-- (redis-py's LUA_EXTEND_SCRIPT semantics with replace_ttl).
-- KEYS[1] lock key; KEYS[2] the fencing counter ({lock key}:fence), its
--         TTL set to ARGV[3] when given (fence.lua); KEYS[3] the requests
--         to release ({lock key}:revoke, hash hold value -> 1,
--         request_release.lua); KEYS[4] (optional) an election's leader
--         record: a key that lives and dies with the lock, given the same
--         TTL; KEYS[5] (optional) the election's kind marker (kind.lua),
--         given the same TTL while it holds 'distlock:election'
-- ARGV[1] the lock's value, ARGV[2] new TTL in milliseconds, ARGV[3]
-- (optional) the fencing counter's TTL in ms (the lease's and the fence
-- retention)
-- Returns 1 when extended, 3 when extended and someone asked this hold to
-- release (the request is kept as long as the hold), 0 when the lock is
-- not ours (nothing changed).
local value = redis.pcall('GET', KEYS[1])
if value ~= ARGV[1] then
  return 0
end
if ARGV[3] then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
if KEYS[4] then
  redis.call('PEXPIRE', KEYS[4], ARGV[2])
end
if KEYS[5] and redis.pcall('GET', KEYS[5]) == 'distlock:election' then
  redis.call('PEXPIRE', KEYS[5], ARGV[2])
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return asked(KEYS[3], ARGV[1], ARGV[2])
