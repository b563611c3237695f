-- Inspect a mutex / fair mutex (or an election): reads only. Prefixed with
-- holds.lua.
-- KEYS[1] lock key, KEYS[2] the holder record of earlier versions (hash:
-- lock, fence, at, owner), KEYS[3] fair queue, KEYS[4] queue deadlines,
-- KEYS[5] waiters' owners, KEYS[6] fencing counter, KEYS[7] the requests
-- to release (hash hold value -> 1, request_release.lua), KEYS[8]
-- (optional) election leader record ('<term> <candidate>')
-- ARGV[1] the holder's role letter ('x' exclusive, 'l' leader)
-- Returns {0, holders, waiters, extra}:
--   holders: {} or {{role, lease ms (-1: no TTL), own, owner, fence, at,
--            asked}} (asked: 1 when someone asked this hold to release)
--            with own 1 for a distlock hold (owner, fence, at as below), 0
--            for a foreign hold (owner, fence and at are then ''); the
--            lock's value itself is never returned. A hold of this version
--            is its own record ('<token>|<owner>', holds.lua): its fence is
--            the fencing counter's value (nothing else takes a token while
--            the lock is held; '' when the counter is gone or not an
--            integer) and its 'acquired at' that token's server time in ms
--            (fence.lua: a token is the server's TIME in µs unless the
--            counter ran ahead of it; '' then). A hold of an earlier
--            version is read from its holder record when that names the
--            lock's current value,
--   waiters: the live queued waiters' owners in queue order ('' unknown),
--   extra: the leader record or ''.
-- {-1, index} when the key at that index has the wrong type.
local function typed(i, want)
  if not KEYS[i] then return true end
  local t = redis.call('TYPE', KEYS[i])['ok']
  return t == 'none' or t == want
end
local wants = {'string', 'hash', 'zset', 'zset', 'hash', nil, 'hash', 'string'}
for i = 1, 8 do
  if wants[i] and not typed(i, wants[i]) then return {-1, i} end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holders = {}
local value = redis.call('GET', KEYS[1])
-- Another kind's marker (kind.lua) is no mutex hold: not shown.
if value and string.sub(value, 1, 9) == 'distlock:' then value = false end
if value then
  local pttl = redis.call('PTTL', KEYS[1])
  local owner = hold_owner(value)
  local record = redis.call('HMGET', KEYS[2], 'lock', 'fence', 'at', 'owner')
  if owner then
    local fence = redis.pcall('GET', KEYS[6])
    local token = type(fence) == 'string' and string.match(fence, '^%d+$') and tonumber(fence)
    local fence_shown, at = '', ''
    if token then
      fence_shown = fence
      local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
      if token <= now_us then at = string.format('%.0f', math.floor(token / 1000)) end
    end
    holders[1] = {ARGV[1], pttl, 1, owner, fence_shown, at}
  elseif record[1] == value then
    holders[1] = {ARGV[1], pttl, 1, record[4] or '', record[2] or '', record[3] or ''}
  else
    holders[1] = {ARGV[1], pttl, 0, '', '', ''}
  end
  holders[1][7] = redis.call('HEXISTS', KEYS[7], value)
end
local waiters = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  local deadline = redis.call('ZSCORE', KEYS[4], id)
  if deadline and tonumber(deadline) > now then
    waiters[#waiters + 1] = redis.call('HGET', KEYS[5], id) or ''
  end
end
local extra = ''
if KEYS[8] then
  extra = redis.call('GET', KEYS[8]) or ''
end
return {0, holders, waiters, extra}
