-- Inspect a read-write lock or a semaphore: reads only.
-- KEYS as rw_acquire.lua / sem_acquire.lua (KEYS[1] the writer or the
-- permits, KEYS[2] holders, KEYS[3] queue, KEYS[4] queue entries' expiry,
-- KEYS[5] fencing counter, KEYS[6] holder records, KEYS[7] waiters' owners,
-- KEYS[8] the requests to release: hash token -> 1, request_release.lua)
-- ARGV[1] 'rw' or 'sem'
-- Returns {0, holders, waiters, extra} as inspect_lock.lua: holders
-- {role ('w', 'r' or 'p'), lease ms, own, owner, fence, at, asked} (asked
-- 1 when someone asked the hold to release; only those
-- whose lease has not expired), waiters the live queued waiters' owners in
-- queue order, extra the semaphore's number of permits or ''.
-- {-1, index} when the key at that index has the wrong type.
local wants = {'string', 'zset', 'zset', 'zset', 'string', 'hash', 'hash', 'hash'}
for i, want in ipairs(wants) do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'none' and t ~= want then return {-1, i} end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holders = {}
-- '<fence> <at> <owner>' -> fence, at, owner
local function split(record)
  local fence, at, owner = string.match(record or '', '^(%d+) (%d+) (.*)$')
  return fence, at, owner
end
local extra = ''
if ARGV[1] == 'rw' then
  local writer = redis.call('GET', KEYS[1])
  if writer then
    local pttl = redis.call('PTTL', KEYS[1])
    local record = redis.call('HGET', KEYS[6], 'w') or ''
    local prefix = writer .. ' '
    local fence, at, owner
    if string.sub(record, 1, #prefix) == prefix then
      fence, at, owner = split(string.sub(record, #prefix + 1))
    end
    local asked = redis.call('HEXISTS', KEYS[8], writer)
    if fence then
      holders[#holders + 1] = {'w', pttl, 1, owner, fence, at, asked}
    else
      holders[#holders + 1] = {'w', pttl, 0, '', '', '', asked}
    end
  end
else
  extra = redis.call('GET', KEYS[1]) or ''
end
local role = 'r'
if ARGV[1] ~= 'rw' then role = 'p' end
local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #live, 2 do
  local fence, at, owner = split(redis.call('HGET', KEYS[6], live[i]))
  local left = math.floor(tonumber(live[i + 1]) - now)
  local asked = redis.call('HEXISTS', KEYS[8], live[i])
  if fence then
    holders[#holders + 1] = {role, left, 1, owner, fence, at, asked}
  else
    holders[#holders + 1] = {role, left, 0, '', '', '', asked}
  end
end
local waiters = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  local deadline = redis.call('ZSCORE', KEYS[4], id)
  if deadline and tonumber(deadline) > now then
    waiters[#waiters + 1] = redis.call('HGET', KEYS[7], id) or ''
  end
end
return {0, holders, waiters, extra}
