-- Release a distlock mutex: delete the lock key only if it still holds our
-- token (redis-py's LUA_RELEASE_SCRIPT semantics), then wake waiters.
-- KEYS[1] lock key; ARGV[1] owner token, ARGV[2] release channel
-- Returns 1 when released, 0 when the lock is not ours (nothing changed).
local value = redis.pcall('GET', KEYS[1])
if value ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], 'released')
return 1
