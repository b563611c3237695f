-- Renew one master's part of a Redlock.
-- KEYS[1] lock key, KEYS[2] holder record, KEYS[3] (optional) fencing
--         counter ({lock key}:redlock:fence)
-- ARGV[1] owner token, ARGV[2] TTL in milliseconds, ARGV[3] the guard's
--         fencing token, ARGV[4] this renewal's round (1, 2, ... per guard),
--         ARGV[5] (with KEYS[3]) the counter's TTL in milliseconds (the new
--         TTL and the fence retention): set again while the lock is ours, so
--         the counter outlives the lease by the retention
-- Returns 1 when renewed (or when a later round of the same guard renewed
-- already), 0 when the lock does not hold ARGV[1].
-- The holder record's fence becomes the guard's token: a master that took
-- the lock after the acquisition was decided (a straggler) wrote its own
-- counter there, which may differ from the token the guard was given.
-- The record also keeps the latest round: a renewal left to finish in the
-- background that lands after a later one (parked on a reconnect, say)
-- changes nothing, so it cannot cut the TTL the later one set (an
-- `extend()` may ask for a longer TTL than the watchdog's).
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if redis.call('HGET', KEYS[2], 'lock') == ARGV[1] then
  local last = tonumber(redis.call('HGET', KEYS[2], 'round') or '0') or 0
  if last > tonumber(ARGV[4]) then
    return 1
  end
  redis.call('HSET', KEYS[2], 'fence', ARGV[3], 'round', ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
if KEYS[3] then
  redis.call('PEXPIRE', KEYS[3], ARGV[5])
end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
