-- One name is one lock: the prelude of the read-write lock's, the
-- semaphore's and the election's scripts (and of fair_acquire.lua, which
-- serves the election).
-- While a read-write lock, a semaphore or an election holds name N, the
-- mutex's lock key (prefix + N) holds that kind's marker, 'distlock:rw',
-- 'distlock:semaphore' or 'distlock:election' (never a token: distlock's
-- and redis-py's are 32 hex digits), expiring 1 ms after the kind's latest
-- hold and deleted with its last one. So a mutex's or a fair mutex's
-- SET NX fails by itself (their failure path reads the marker and refuses
-- with Conflict) and a redis-py Lock waits; and each of these kinds reads
-- the lock key in its acquire script and refuses when it holds a token (a
-- mutex, a fair mutex, redis-py) or another kind's marker. The check and the
-- marking run in one script with the hold, so two kinds never both get in.
-- A plain mutex's hand-over reservation in the lock key (holds.lua, which
-- precedes this prelude) is no hold: the name is free for every kind.
-- Defines functions only: no server call until one is called.
local KIND_MARKERS = {['distlock:rw'] = 1, ['distlock:semaphore'] = 2, ['distlock:election'] = 3}
-- Who else has the name: 0 when the lock key is free or holds `marker`;
-- 1..3 another kind's marker (as KIND_MARKERS); 4 a token (a mutex, a fair
-- mutex, redis-py); 5 a key that is not a string.
local function kind_other(lock, marker)
  local t = redis.call('TYPE', lock)['ok']
  if t == 'none' then return 0 end
  if t ~= 'string' then return 5 end
  local value = redis.call('GET', lock)
  if value == marker or reserved_for(value) then return 0 end
  return KIND_MARKERS[value] or 4
end
-- The latest expiry (server ms) of the holds in the zset `holders` (member ->
-- expiry) and, when given, of the string key `exclusive` (by its PTTL; -1 no
-- TTL counts as a day); nil when nothing is held.
local function kind_latest(now, holders, exclusive)
  local latest = nil
  if exclusive then
    local left = redis.call('PTTL', exclusive)
    if left == -1 then left = 86400000 end
    if left >= 0 then latest = now + left end
  end
  local top = redis.call('ZRANGE', holders, -1, -1, 'WITHSCORES')
  if top[2] and tonumber(top[2]) > now and (not latest or tonumber(top[2]) > latest) then
    latest = tonumber(top[2])
  end
  return latest
end
-- Keeps `marker` in the lock key until `latest` + 1 ms, or deletes it when
-- `latest` is nil (nothing held). Never touches a token or another kind's
-- marker.
local function kind_keep(lock, marker, latest)
  local value = redis.pcall('GET', lock)
  if type(value) == 'table' then return end
  if latest then
    if value and value ~= marker and not reserved_for(value) then return end
    redis.call('SET', lock, marker)
    redis.call('PEXPIREAT', lock, string.format('%.0f', latest + 1))
  elseif value == marker then
    redis.call('DEL', lock)
  end
end
