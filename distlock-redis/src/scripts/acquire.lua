-- Acquire a distlock mutex: SET NX PX and, on success, the next fencing token.
-- KEYS[1] lock key (prefix + name), KEYS[2] fencing counter ({lock key}:fence),
-- KEYS[3] (optional) holder record ({lock key}:holder, hash: lock = the lock's value,
--         fence, at = acquired at in server ms, owner = owner identity;
--         same TTL as the lock key),
-- KEYS[4] (optional, with KEYS[5] and KEYS[6]) the waiting providers ({lock key}:waiting,
--         zset provider id -> place in line), KEYS[5] the hand-over
--         reservation ({lock key}:handoff, string: the provider id a release
--         woke, with a short TTL)
-- ARGV[1] attempt token (the lock's value), ARGV[2] TTL in milliseconds,
-- ARGV[3] owner identity, ARGV[4] this provider's id, ARGV[5] '0' do not
-- queue (try_lock), '1' queue at the back when refused, '2' queue at the
-- front when refused (a woken waiter that lost the lock to someone else),
-- KEYS[6] (with KEYS[4]) the line's liveness ({lock key}:waiting:alive, zset
--         provider id -> server ms until which it can hear a hand-over)
-- ARGV[6] '1' when other waiters of this provider still wait after this one,
-- ARGV[7] '1' when an earlier attempt of this call queued (this provider may
-- be in line), ARGV[8] how long from now (ms) this provider can be counted
-- on to hear a hand-over ('0': its pub/sub connection is not known to
-- deliver: it is taken off the line rather than queued)
-- Returns {1, fencing token, 0} when acquired,
--         {0, remaining PTTL, publishes} when held by someone else (or
--                reserved for another provider: the reservation's PTTL);
--                publishes is 1 when the holder is a distlock holder, which
--                publishes on release, 0 for a foreign one (redis-py), which
--                does not,
--         {2, 0, 0} when the lock already holds ARGV[1]: this very attempt ran
--                before (a client resent it after a lost reply), so its
--                fencing token is unknown; the caller releases and retries,
--         {-1, 0, 0} when the lock key holds a value that is not a string,
--         {-2, 0, 0} when the fencing counter is not an integer,
--         {-3, 0, 0} when the fencing counter is exhausted (2^53: Lua numbers
--                 are doubles, exact only below it),
--         {-4, kind, 0} when another kind of primitive holds the name: the
--                 lock key holds its marker (kind.lua: 1 read-write lock,
--                 2 semaphore, 3 election); the attempt does not queue.
-- The token is INCR of the counter, raised to the server's TIME in
-- microseconds when the counter is below it (and stored): tokens keep
-- increasing when the counter is lost (restart without persistence,
-- eviction, failover to a replica that missed the last INCR), as long as the
-- server's clock does not step back.
-- The line (KEYS[4], KEYS[5]): a waiting provider is in the zset once, however
-- many of its tasks wait; a release pops the first and reserves the free lock
-- for it for a moment, so its waiter gets in rather than whoever asks first,
-- and providers take turns instead of one re-taking the lock. The
-- reservation binds distlock clients only (redis-py ignores it); mutual
-- exclusion never depends on it.
-- Nothing is left changed unless the lock is acquired, except the line
-- (scripts run atomically, so undoing the SET is invisible to everyone else).
local line = KEYS[4] and KEYS[5] and KEYS[6]
local reserved = false
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Keeps this provider's place alive (or, unreachable, takes it off the line).
local function alive()
  local ms = tonumber(ARGV[8]) or 0
  if ms <= 0 then
    redis.call('ZREM', KEYS[4], ARGV[4])
    redis.call('ZREM', KEYS[6], ARGV[4])
    return false
  end
  redis.call('ZADD', KEYS[6], now_ms() + ms, ARGV[4])
  redis.call('PEXPIRE', KEYS[6], 60000)
  return true
end
local function queue()
  if not line or ARGV[5] == '0' then return end
  if not alive() then return end
  if ARGV[5] == '2' then
    local first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
    local place = 0
    if first[2] then place = tonumber(first[2]) - 1 end
    redis.call('ZADD', KEYS[4], place, ARGV[4])
  else
    local t = redis.call('TIME')
    redis.call('ZADD', KEYS[4], 'NX', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), ARGV[4])
  end
  redis.call('PEXPIRE', KEYS[4], 60000)
end
-- try_lock (ARGV[5] '0') takes a free lock even when it is reserved: the
-- reservation is an order among waiters, not a hold, and its provider may
-- have died (it expires, but a free lock must not look busy meanwhile).
-- A reservation is for a free lock: once someone else holds the lock (a
-- try_lock, or a client that ignores reservations, such as redis-py), the
-- reserved provider has lost that turn (its woken waiter, finding the lock
-- taken, queues again at the front); the reservation is void, so every
-- waiter may take the lock when it is next free (a release by distlock
-- reserves it again for the first in line).
if line and ARGV[5] ~= '0' then
  reserved = redis.call('GET', KEYS[5])
  if reserved and reserved ~= ARGV[4] and redis.call('EXISTS', KEYS[1]) == 1 then
    redis.call('DEL', KEYS[5])
    reserved = false
  end
  if reserved and reserved ~= ARGV[4] then
    queue()
    local left = redis.call('PTTL', KEYS[5])
    local held = redis.call('PTTL', KEYS[1])
    if held > left then left = held end
    return {0, left, 1}
  end
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local token = redis.pcall('INCR', KEYS[2])
  if type(token) == 'table' then
    redis.call('DEL', KEYS[1])
    if string.find(token['err'] or '', 'overflow', 1, true) then
      return {-3, 0, 0}
    end
    return {-2, 0, 0}
  end
  local now = redis.call('TIME')
  local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
  if token < floor then
    redis.call('SET', KEYS[2], string.format('%.0f', floor))
    token = floor
  end
  if token >= 9007199254740992 then
    redis.call('DEL', KEYS[1])
    return {-3, 0, 0}
  end
  if KEYS[3] then
    local at = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    -- Every field is set: no DEL needed to drop an older record's.
    redis.call('HSET', KEYS[3], 'lock', ARGV[1], 'fence', string.format('%.0f', token),
      'at', string.format('%.0f', at), 'owner', ARGV[3] or '')
    redis.call('PEXPIRE', KEYS[3], ARGV[2])
  end
  if line then
    if reserved then
      redis.call('DEL', KEYS[5])
    end
    if ARGV[6] == '1' then
      if alive() then
        redis.call('ZADD', KEYS[4], 'NX', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000), ARGV[4])
        redis.call('PEXPIRE', KEYS[4], 60000)
      end
    elseif ARGV[7] == '1' then
      redis.call('ZREM', KEYS[4], ARGV[4])
      redis.call('ZREM', KEYS[6], ARGV[4])
    end
  end
  return {1, token, 0}
end
if redis.call('TYPE', KEYS[1])['ok'] ~= 'string' then
  return {-1, 0, 0}
end
local value = redis.call('GET', KEYS[1])
if value == ARGV[1] then
  return {2, 0, 0}
end
-- Read only on this failure path: the acquisition itself pays nothing.
local marked = ({['distlock:rw'] = 1, ['distlock:semaphore'] = 2, ['distlock:election'] = 3})[value]
if marked then
  return {-4, marked, 0}
end
queue()
local publishes = 0
if KEYS[3] and redis.call('TYPE', KEYS[3])['ok'] == 'hash'
    and redis.call('HGET', KEYS[3], 'lock') == value then
  publishes = 1
end
return {0, redis.call('PTTL', KEYS[1]), publishes}
