-- The fencing rule, once (a prelude: defines functions only, no server call
-- until one is called). Every distlock token of a single-master provider
-- (mutex, fair mutex, election, read-write lock, semaphore, and their
-- force-releases) is taken here.
-- fence_next(counter, t, px) takes the next token of the fencing counter
-- `counter` (a string key holding an integer, as INCR keeps it), t being a
-- TIME reply: token = max(counter + 1, t in microseconds), stored in the
-- counter with the TTL px (ms: the lease's TTL and the fence retention,
-- RedisOptions::fence_retention), so a name left unused leaves no key; the
-- renewals (extend.lua, rw_extend.lua, sem_extend.lua) set it again. The
-- counter's expiry cannot make a token go back: the next token is then the
-- server's TIME, past every earlier token unless the clock was set back by
-- more than the retention in between (the crate docs, Fencing tokens).
-- Without px the counter keeps the TTL it has (every caller gives one;
-- Redlock's force-release gives the retention alone). So tokens keep increasing when the counter is lost (restart
-- without persistence, eviction, failover to a replica that missed the last
-- write), as long as the server's clock does not step back; and a client
-- that INCRs the same counter (a distlock of an earlier version during a
-- rolling upgrade) stays in the same order, since both take
-- max(previous + 1, ...) atomically.
-- Returns the token, or nil and -2 when the counter is not an integer (of
-- another type, or a string INCR refuses: it is left exactly as it was), or
-- nil and -3 when it is exhausted (the next token would be 2^53 or more:
-- Lua numbers are doubles, exact only below it; the counter is unchanged).
-- Two calls in the steady state: TIME (the caller's) and SET counter floor
-- PX px GET (Redis 6.2+; the old value comes back with the write); a
-- third, SET old + 1, only when the counter is ahead of the clock. Before
-- 6.2 SET … GET is refused and GET + SET are used instead.
local FENCE_LIMIT = 9007199254740992
-- The integer INCR would accept in `v` (a decimal within a signed 64-bit
-- integer, no sign but '-', no leading zero), else nil.
local function fence_integer(v)
  if type(v) ~= 'string' then return nil end
  local sign, digits = string.match(v, '^(%-?)(%d+)$')
  if not digits or #digits > 19 then return nil end
  if #digits > 1 and string.sub(digits, 1, 1) == '0' then return nil end
  if sign == '-' and digits == '0' then return nil end
  if #digits == 19 then
    local limit = '9223372036854775807'
    if sign == '-' then limit = '9223372036854775808' end
    if digits > limit then return nil end
  end
  return tonumber(v)
end
-- SET counter value with the TTL px, or keeping the TTL without px; GET
-- returns the old value (SET … GET).
local function fence_set(counter, value, px, get)
  if px and get then return redis.pcall('SET', counter, value, 'PX', px, 'GET') end
  if px then return redis.call('SET', counter, value, 'PX', px) end
  if get then return redis.pcall('SET', counter, value, 'KEEPTTL', 'GET') end
  return redis.call('SET', counter, value, 'KEEPTTL')
end
local function fence_next(counter, t, px)
  local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local old = fence_set(counter, string.format('%.0f', floor), px, true)
  local written = true
  if type(old) == 'table' then
    if string.find(old['err'] or '', 'WRONGTYPE', 1, true) then return nil, -2 end
    -- No SET … GET on this server: read, then write.
    written = false
    old = redis.pcall('GET', counter)
    if type(old) == 'table' then return nil, -2 end
  end
  local token = floor
  if old then
    local previous = fence_integer(old)
    local refused = nil
    if not previous then
      refused = -2
    elseif previous + 1 >= FENCE_LIMIT then
      refused = -3
    end
    if refused then
      -- The value as it was; its TTL is the one just written (SET … GET
      -- replaced the old one with it).
      if written then redis.call('SET', counter, old, 'KEEPTTL') end
      return nil, refused
    end
    if previous >= floor then token = previous + 1 end
  end
  if token >= FENCE_LIMIT then
    if written then
      if old then redis.call('SET', counter, old, 'KEEPTTL') else redis.call('DEL', counter) end
    end
    return nil, -3
  end
  if not written then
    -- Before Redis 6.2 (no SET … GET; before 6.0 no KEEPTTL either).
    if px then
      redis.call('SET', counter, string.format('%.0f', token), 'PX', px)
    else
      redis.call('SET', counter, string.format('%.0f', token))
    end
  elseif token ~= floor then
    fence_set(counter, string.format('%.0f', token), px, false)
  end
  return token
end
-- fence_if_evicted(evicted, counter, t, px): a force-release's token, taken
-- as an acquisition takes one (fence_next) so the next holder's token is
-- above it, but only when `evicted` (there is a hold to evict): a name
-- nobody holds is left as it is (no counter is created for it) and gives 0.
-- Returns the token (0 when nothing is evicted), or nil and fence_next's
-- refusal (-2, -3).
local function fence_if_evicted(evicted, counter, t, px)
  if not evicted then return 0 end
  return fence_next(counter, t, px)
end
