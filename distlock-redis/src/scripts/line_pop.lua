-- Prelude of mutex_release.lua and mutex_pass.lua: the first provider in a
-- plain mutex's line that can still claim a hand-over.
-- Each provider in the line ({lock key}:waiting, zset id -> place) has a
-- liveness deadline ({lock key}:waiting:alive, zset id -> server ms) that its
-- attempts and its pub/sub connection's health checks push on while it is
-- alive and hears its channel. A member whose deadline passed (a dead,
-- closed or silent provider) is dropped here, never handed the lock.
-- A member without any deadline is a provider of an earlier version that
-- keeps none (it waits by retrying, and honours the reservation in
-- {lock key}:handoff): it is returned as such, to be handed the lock its
-- own way rather than passed over (a dead one costs one reservation, once:
-- it is off the line then).
-- pop_live(waiting, alive) takes the first live provider off the line and
-- returns its id and whether it is of such an earlier version (dead ones
-- before it are dropped), or nil.
local function pop_live(waiting, alive)
  local now = nil
  while true do
    local first = redis.pcall('ZPOPMIN', waiting)
    if type(first) ~= 'table' or not first[1] then return nil end
    if not now then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    local deadline = redis.pcall('ZSCORE', alive, first[1])
    redis.pcall('ZREM', alive, first[1])
    if type(deadline) ~= 'string' then
      return first[1], true
    end
    if tonumber(deadline) > now then
      return first[1], false
    end
  end
end
