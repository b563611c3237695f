-- Renew one master's part of a Redlock.
-- KEYS[1] lock key, KEYS[2] holder record
-- ARGV[1] owner token, ARGV[2] TTL in milliseconds, ARGV[3] the guard's
--         fencing token
-- Returns 1 when renewed, 0 when the lock does not hold ARGV[1].
-- The holder record's fence becomes the guard's token: a master that took
-- the lock after the acquisition was decided (a straggler) wrote its own
-- counter there, which may differ from the token the guard was given.
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if redis.call('HGET', KEYS[2], 'lock') == ARGV[1] then
  redis.call('HSET', KEYS[2], 'fence', ARGV[3])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
