-- Acquire a distlock mutex: SET NX PX and, on success, the next fencing token.
-- Prefixed with holds.lua (what the lock key holds) and fence.lua (the token).
-- KEYS[1] lock key (prefix + name), KEYS[2] fencing counter ({lock key}:fence),
-- KEYS[3] the holder record of earlier versions ({lock key}:holder, hash:
--         lock = the lock's value, fence, at, owner): read only on the
--         failure path, to tell their holds (which publish on release) from
--         foreign ones; this version writes none (holds.lua),
-- KEYS[4] (optional, with KEYS[5] to KEYS[7]) the waiting providers
--         ({lock key}:waiting, zset provider id -> place in line), KEYS[5]
--         the hand-over reservation of earlier versions ({lock key}:handoff,
--         string: a provider id, short TTL): void once someone holds the
--         lock (deleted on the failure path behind a hold that is not this
--         version's); this version reserves in the lock key (holds.lua),
-- KEYS[6] the line's liveness ({lock key}:waiting:alive, zset provider id
--         -> server ms until which it can hear a hand-over),
-- KEYS[7] the listeners ({lock key}:listening, zset provider id -> server
--         ms until which it listens; the key expires with the latest): a
--         provider whose waiter could not join the line (its pub/sub
--         connection is not known to deliver) and still listens, so that a
--         release with nobody in line publishes; taken off by its next
--         attempt that joins the line, by its acquisition and by its leave
--         (mutex_pass.lua)
-- ARGV[1] the lock's value ('<attempt token>|<owner>', holds.lua), ARGV[2]
-- TTL in milliseconds, ARGV[3] owner identity, ARGV[4] this provider's id,
-- ARGV[5] '0' do not queue (try_lock), '1' queue at the back when refused,
-- '2' queue at the front when refused (a woken waiter that lost the lock to
-- someone else), ARGV[6] '1' when other waiters of this provider still wait
-- after this one, ARGV[7] '1' when an earlier attempt of this call queued
-- (this provider may be in line), ARGV[8] how long from now (ms) this
-- provider can be counted on to hear a hand-over ('0': its pub/sub
-- connection is not known to deliver: it is taken off the line rather than
-- queued, and marks KEYS[7] instead), ARGV[9] how long (ms) that mark lasts,
-- ARGV[10] the fencing counter's TTL in ms (the lease's and the fence retention)
-- (until the waiter's next look, at the latest),
-- KEYS[8] (optional, with ARGV[11]) the release's streak ({lock key}:streak,
-- mutex_release.lua): a refused attempt that finds a hold that is not
-- this version's (redis-py, an earlier version) sets it to ARGV[11], so
-- that releases leave the lock free as a turn after a few hand-overs
-- rather than after the longest streak;
-- ARGV[12] '1' when this attempt's provider held back for a turn (see
-- mutex_release.lua) and saw someone take it: sets KEYS[8] so too when the
-- attempt finds the lock free (that hold is over: it was not this
-- version's, whose holds last longer than a look; when it finds a hold,
-- the hold tells)
-- (A handed-over lock: the provider was taken off the line by the release
-- that reserved it, and off the listeners by the attempt that queued it.)
-- Returns {1, fencing token, 0} when acquired,
--         {0, remaining PTTL, publishes} when held by someone else (or
--                reserved for another provider: the reservation's PTTL);
--                publishes is 1 when the holder is a distlock holder (of
--                this version or an earlier one), which publishes on
--                release, 0 for a foreign one (redis-py), which does not,
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
-- Uncontended, this is three calls: SET NX PX GET, TIME, SET fence … GET.
-- The line (KEYS[4], KEYS[6]): a waiting provider is in the zset once,
-- however many of its tasks wait; a release pops the first live one and
-- reserves the free lock for it for a moment, so its waiter gets in rather
-- than whoever asks first, and providers take turns instead of one
-- re-taking the lock. Mutual exclusion never depends on it.
-- Nothing is left changed unless the lock is acquired, except the line
-- (scripts run atomically, so undoing the SET is invisible to everyone else).
local line = KEYS[4] and KEYS[5] and KEYS[6]
local t = nil
local function now_ms()
  if not t then t = redis.call('TIME') end
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Takes this provider off the listeners: only an attempt after an earlier
-- one of the same call (ARGV[7]) can have put it there (a call that ends
-- takes it off, acquiring or leaving).
local function unlisten()
  if KEYS[7] and ARGV[7] == '1' then redis.call('ZREM', KEYS[7], ARGV[4]) end
end
-- Keeps this provider's place alive (or, unreachable, takes it off the line
-- and marks that it listens).
local function alive()
  local ms = tonumber(ARGV[8]) or 0
  if ms <= 0 then
    redis.call('ZREM', KEYS[4], ARGV[4])
    redis.call('ZREM', KEYS[6], ARGV[4])
    if KEYS[7] then
      local listen = tonumber(ARGV[9]) or 1000
      redis.call('ZADD', KEYS[7], now_ms() + listen, ARGV[4])
      redis.call('PEXPIRE', KEYS[7], listen)
    end
    return false
  end
  redis.call('ZADD', KEYS[6], now_ms() + ms, ARGV[4])
  redis.call('PEXPIRE', KEYS[6], 60000)
  unlisten()
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
    redis.call('ZADD', KEYS[4], 'NX', now_ms(), ARGV[4])
  end
  redis.call('PEXPIRE', KEYS[4], 60000)
end
-- The lock is ours (SET already): the token, then the line.
-- `handed` is true when it was reserved for this provider: the release
-- that reserved it took this provider off the line, and no attempt of this
-- provider was refused since (the reservation would have let it in), so
-- there is nothing to take off.
local function take(handed)
  if KEYS[8] and ARGV[12] == '1' then
    -- Someone outside the line took a turn: the next comes soon.
    redis.call('SET', KEYS[8], ARGV[11], 'PX', 60000)
  end
  if not t then t = redis.call('TIME') end
  local token, refused = fence_next(KEYS[2], t, ARGV[10])
  if not token then
    redis.call('DEL', KEYS[1])
    return {refused, 0, 0}
  end
  if line then
    if ARGV[6] == '1' then
      if alive() then
        redis.call('ZADD', KEYS[4], 'NX', now_ms(), ARGV[4])
        redis.call('PEXPIRE', KEYS[4], 60000)
      end
    elseif ARGV[7] == '1' and not handed then
      redis.call('ZREM', KEYS[4], ARGV[4])
      redis.call('ZREM', KEYS[6], ARGV[4])
      unlisten()
    end
  end
  return {1, token, 0}
end
-- SET NX with GET (Redis 7.0+): nil when it was set, else the value there.
local value = redis.pcall('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if type(value) == 'table' then
  if string.find(value['err'] or '', 'WRONGTYPE', 1, true) then return {-1, 0, 0} end
  -- Before 7.0: NX and GET do not go together.
  if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    value = false
  else
    value = redis.pcall('GET', KEYS[1])
    if type(value) == 'table' then return {-1, 0, 0} end
  end
end
if not value then
  return take(false)
end
if value == ARGV[1] then
  return {2, 0, 0}
end
-- Read only on this failure path: the acquisition itself pays nothing.
local marked = ({['distlock:rw'] = 1, ['distlock:semaphore'] = 2, ['distlock:election'] = 3})[value]
if marked then
  return {-4, marked, 0}
end
local reserved = reserved_for(value)
if reserved then
  -- try_lock (ARGV[5] '0') takes a free lock even when it is reserved: the
  -- reservation is an order among waiters, not a hold, and its provider
  -- may have died (it expires, but a free lock must not look busy
  -- meanwhile).
  if reserved == ARGV[4] or ARGV[5] == '0' then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return take(reserved == ARGV[4])
  end
  queue()
  return {0, redis.call('PTTL', KEYS[1]), 1}
end
local publishes = 0
if hold_owner(value) then
  publishes = 1
else
  -- A foreign hold, or an earlier version's (with its holder record).
  if line then redis.call('DEL', KEYS[5]) end
  if KEYS[8] and ARGV[11] then
    -- Clients outside the line are about: turns come soon (see KEYS[8]).
    redis.call('SET', KEYS[8], ARGV[11], 'PX', 60000)
  end
  if KEYS[3] and redis.pcall('HGET', KEYS[3], 'lock') == value then
    publishes = 1
  end
end
queue()
return {0, redis.call('PTTL', KEYS[1]), publishes}
