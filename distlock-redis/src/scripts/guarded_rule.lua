-- The fencing rule at the resource (distlock_core::fence), once: a prelude
-- (functions only, no server call until one is called) of every
-- guarded_*.lua script. Not the lock's token script (fence.lua): that takes
-- a lock's tokens, this checks the tokens a resource is written with.
--
-- A resource's fence is a hash (the script's KEYS[1], named
-- `{key}:distlock:highest`, in the key's Cluster slot) with two fields:
-- `token`, the highest token admitted, and `exclusive`, the highest token
-- of an exclusive holder admitted; both missing for a resource that
-- admitted nothing. Tokens are decimal strings of a u64 (no sign, no
-- leading zero: the Rust side formats them) and compared as strings, since
-- Lua numbers are doubles and exact only below 2^53.
--
-- The rule: an exclusive token ('x') is admitted if it is at least
-- `token`, a shared one ('s') if it is at least `exclusive`; equal is the
-- same holder. A guarded script checks (guarded_check), writes, and only
-- when its write succeeded records the token (guarded_record): a refused
-- or failed write changes nothing.
--
-- The keys a guarded script writes (KEYS[2..]) are never a fence nor a
-- lock's internal key: the Rust side refuses those names before it sends
-- the script (distlock_core::fence::check_resource, the resource rule), so
-- no write here can lower or delete a fence.

-- a < b for two decimal strings without leading zeros.
local function guarded_less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end

-- A field of the fence as stored: '0' when missing; raises an error reply
-- (code DISTLOCK_FENCE) when it is not a decimal.
local function guarded_field(v, fence)
  if not v then return '0' end
  if not string.match(v, '^%d+$') then
    error({err = 'DISTLOCK_FENCE ' .. fence .. ' is not a distlock fence (a field is not a token)'})
  end
  return v
end

-- guarded_check(fence, token, hold): true and the fence's `token` field
-- when `token` (hold 'x' or 's') is admitted; false and the number it was
-- compared with when it is refused. Raises WRONGTYPE when the fence key is
-- not a hash.
local function guarded_check(fence, token, hold)
  local h = redis.call('HMGET', fence, 'token', 'exclusive')
  local top = guarded_field(h[1], fence)
  local floor = guarded_field(h[2], fence)
  local bar = top
  if hold ~= 'x' then bar = floor end
  if guarded_less(token, bar) then return false, bar end
  return true, top
end

-- Records an admitted `token` after its write succeeded; `top` is what
-- guarded_check returned.
local function guarded_record(fence, token, hold, top)
  if hold == 'x' then
    redis.call('HSET', fence, 'token', token, 'exclusive', token)
  elseif guarded_less(top, token) then
    redis.call('HSET', fence, 'token', token)
  end
end
