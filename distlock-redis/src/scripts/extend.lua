-- Extend a distlock mutex: set its TTL only if it still holds our token
-- (redis-py's LUA_EXTEND_SCRIPT semantics with replace_ttl).
-- KEYS[1] lock key; KEYS[2] (optional) the holder record of earlier
--         versions (unused: this version's hold is its own record, see
--         holds.lua); KEYS[3] (optional) an election's leader record: a key
--         that lives and dies with the lock, given the same TTL; KEYS[4]
--         (optional) the election's kind marker (kind.lua), given the same
--         TTL while it holds 'distlock:election'
-- ARGV[1] the lock's value, ARGV[2] new TTL in milliseconds
-- Returns 1 when extended, 0 when the lock is not ours (nothing changed).
local value = redis.pcall('GET', KEYS[1])
if value ~= ARGV[1] then
  return 0
end
if KEYS[3] then
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
if KEYS[4] and redis.pcall('GET', KEYS[4]) == 'distlock:election' then
  redis.call('PEXPIRE', KEYS[4], ARGV[2])
end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
