-- Ask the current holders of a name (as one kind) to release: marks each
-- hold in the kind's requests hash, which the holder's next renewal reads
-- (extend.lua, rw_extend.lua, sem_extend.lua answer 3). Ends no hold and
-- changes no hold; creates nothing when nobody holds.
-- ARGV[1] the family: 'lock' (mutex, fair mutex, election), 'rw' or 'sem'
-- 'lock': KEYS[1] the lock key (value '<token>|<owner>', or a foreign
--         value: marked too, though a foreign client cannot hear it),
--         KEYS[2] the requests hash ({lock key}:revoke)
-- 'rw' / 'sem': KEYS[1] the writer (rw; the semaphore's permits key is
--         not read), KEYS[2] the holders (zset token -> expiry in server
--         ms), KEYS[3] the requests hash ({lock}:rw:revoke, …:sem:revoke)
-- Returns the number of holds marked. A key of the wrong type marks
-- nothing (inspect then names it).
-- The requests hash (hold value or token -> 1) lives at least as long as
-- the longest hold marked; renewals that read a request keep it as long.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function typed(key, want)
  local found = redis.call('TYPE', key)['ok']
  return found == 'none' or found == want
end
local function keep(key, until_ms)
  local left = redis.call('PTTL', key)
  if left < 0 or now + left < until_ms then
    redis.call('PEXPIREAT', key, string.format('%.0f', until_ms))
  end
end
local marked = 0
if ARGV[1] == 'lock' then
  if not typed(KEYS[1], 'string') or not typed(KEYS[2], 'hash') then return 0 end
  local value = redis.call('GET', KEYS[1])
  -- Another kind's marker or a hand-over reservation is no hold.
  if not value or string.sub(value, 1, 9) == 'distlock:' then return 0 end
  redis.call('HSET', KEYS[2], value, '1')
  local left = redis.call('PTTL', KEYS[1])
  if left < 0 then left = 86400000 end
  keep(KEYS[2], now + left)
  return 1
end
if not typed(KEYS[2], 'zset') or not typed(KEYS[3], 'hash') then return 0 end
local last = 0
if ARGV[1] == 'rw' then
  if not typed(KEYS[1], 'string') then return 0 end
  local writer = redis.call('GET', KEYS[1])
  if writer then
    redis.call('HSET', KEYS[3], writer, '1')
    marked = marked + 1
    local left = redis.call('PTTL', KEYS[1])
    if left < 0 then left = 86400000 end
    last = now + left
  end
end
local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #live, 2 do
  redis.call('HSET', KEYS[3], live[i], '1')
  marked = marked + 1
  last = math.max(last, tonumber(live[i + 1]))
end
if marked > 0 then keep(KEYS[3], last) end
return marked
