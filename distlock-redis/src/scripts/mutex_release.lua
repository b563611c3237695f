-- Release a distlock mutex (the plain one): compare-and-delete, then hand
-- over to the next waiting provider, if anyone waits.
-- Prefixed with holds.lua, queue.lua (the fair purge) and line_pop.lua.
-- KEYS[1] lock key, KEYS[2] fair queue, KEYS[3] fair queue deadlines,
-- KEYS[4] holder record of earlier versions (unused: this version writes
-- none; an earlier version's holder deletes its own), KEYS[5] fair
-- waiters' owners (as release.lua: fair waiters of the same name go first),
-- KEYS[6] the waiting providers ({lock key}:waiting, zset provider id ->
-- place), KEYS[7] the hand-over reservation of earlier versions
-- ({lock key}:handoff: set for a member of the line of such a version),
-- KEYS[8] the line's liveness ({lock key}:waiting:alive, see line_pop.lua),
-- KEYS[9] the listeners ({lock key}:listening, see acquire.lua), KEYS[10]
-- (optional) the streak ({lock key}:streak, an integer: the hand-overs in
-- a row since the last turn, plus STREAK_UNIT times the hand-overs due
-- before the next turn (0: ARGV[4]); expires a minute after the last turn)
-- ARGV[1] the lock's value, ARGV[2] release channel, ARGV[3] reservation
-- TTL in ms, ARGV[4] (with KEYS[10]) the longest streak, ARGV[5] the turn
-- in ms (how long this version's waiters let others ask first)
-- Returns 1 when released, 2 when released and left free as a turn for
-- others (the caller's provider holds back for ARGV[5] ms), 0 when the lock
-- is not ours (nothing changed).
-- Nobody waits (no fair queue, no line, no listener, no streak left by
-- the last contention: one EXISTS): the lock key is deleted, three calls in
-- all. A release with nobody in line deletes the streak, unless turns came
-- often (someone outside the line took one): then it stays until turns
-- nobody takes have doubled it back to ARGV[4], or it expires, and a lone
-- holder meanwhile pays a few turns. Else the hand-over: 'to:<id>'
-- of the first live fair waiter; else the first live waiting provider is
-- taken off the line (dead ones are dropped), the lock key is set to its
-- reservation (holds.lua) for ARGV[3] ms and 'to:<provider id>' wakes one
-- waiter there (one wake-up per release across all providers); else
-- 'released' (one plain waiter of each provider that listens wakes, as for
-- clients that do not queue). The reservation overwrites our value, which
-- no one sees in between (scripts run atomically): the key is deleted only
-- when it is left free.
-- Turns: clients that are not in this line (redis-py, anything polling with
-- SET NX) leave no trace when refused, and a line that never empties would
-- keep the key held or reserved for good. So after a streak of hand-overs
-- the release leaves the key free instead (nobody is popped: the line
-- keeps its order) and publishes 'turn:<ARGV[5]>[:<provider id>]': this
-- version's waiters hold back that long, so a poller's SET NX gets in, and
-- then the named provider's waiter asks; earlier versions' waiters take it
-- as a plain wake-up and ask at once.
-- The streak is ARGV[4] hand-overs at first; once someone outside the line
-- took a turn or was found holding, acquire.lua sets it to a few (its
-- ARGV[11]); every turn then doubles it, up to ARGV[4], until someone takes
-- one again. So turns come often while they are taken, and seldom (a free
-- lock for ARGV[5] ms every ARGV[4] hand-overs) on a name that only this
-- version uses. A member of an
-- earlier version's line (no liveness entry, line_pop.lua) gets its
-- hand-over that version's way: the key left free, {lock key}:handoff set
-- to it (which that version's acquire honours), and a turn for this
-- version. The streak is a count, so mutual exclusion and fencing never
-- depend on it.
-- The streak's count of hand-overs is its value modulo this.
local STREAK_UNIT = 1024
local value = redis.pcall('GET', KEYS[1])
if value ~= ARGV[1] then
  return 0
end
if redis.call('EXISTS', KEYS[2], KEYS[6], KEYS[9], KEYS[10] or KEYS[9]) == 0 then
  redis.call('DEL', KEYS[1])
  return 1
end
local head = nil
if redis.call('TYPE', KEYS[2])['ok'] == 'zset'
    and redis.call('TYPE', KEYS[3])['ok'] == 'zset' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  fair_drop_dead(KEYS[2], KEYS[3], KEYS[5], now)
  head = fair_head(KEYS[2], KEYS[3], KEYS[5])
end
if head then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'to:' .. head)
  return 1
end
-- Leaves the key free as a turn for others (see above); `after`: the
-- hand-overs before the next turn (nil: the streak is left as it is).
-- The message names the first live provider in line, whose waiter asks
-- once the turn is over: one wake-up per turn across this version's
-- providers (every provider holds back; earlier versions wake one waiter
-- each on any message that is not 'to:'). Without one, every provider
-- wakes one waiter.
local function turn(after)
  redis.call('DEL', KEYS[1])
  if after then
    redis.call('SET', KEYS[10], after * STREAK_UNIT, 'PX', 60000)
  end
  local msg = 'turn:' .. ARGV[5]
  local first = redis.pcall('ZRANGE', KEYS[6], 0, 0)
  if type(first) == 'table' and first[1] then
    local deadline = redis.pcall('ZSCORE', KEYS[8], first[1])
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if type(deadline) == 'string' and tonumber(deadline) > now then
      msg = msg .. ':' .. first[1]
    end
  end
  redis.call('PUBLISH', ARGV[2], msg)
  return 2
end
-- Whether turns come often (someone outside the line took one lately).
local often = false
if KEYS[10] then
  local streak = redis.pcall('INCR', KEYS[10])
  if type(streak) ~= 'number' then
    -- Not a counter: start again.
    redis.call('DEL', KEYS[10])
  else
    local longest = tonumber(ARGV[4])
    local after = math.floor(streak / STREAK_UNIT)
    often = after > 0 and after < longest
    if after == 0 then
      -- A streak of its own (no turn yet): the longest.
      after = longest
      if streak == 1 then redis.call('PEXPIRE', KEYS[10], 60000) end
    end
    if streak % STREAK_UNIT > after then
      -- Twice as long until the next, unless someone takes this one.
      return turn(math.min(after * 2, longest))
    end
  end
end
local nxt, earlier = pop_live(KEYS[6], KEYS[8])
if nxt and earlier then
  redis.call('SET', KEYS[7], nxt, 'PX', ARGV[3])
  return turn(nil)
elseif nxt then
  redis.call('SET', KEYS[1], HANDOFF_PREFIX .. nxt, 'PX', ARGV[3])
  redis.call('PUBLISH', ARGV[2], 'to:' .. nxt)
else
  redis.call('DEL', KEYS[1])
  -- Nobody in line: the streak ends, unless turns come often (the line
  -- empties for a moment between short holds; the key expires by itself).
  if KEYS[10] and not often then redis.call('DEL', KEYS[10]) end
  redis.call('PUBLISH', ARGV[2], 'released')
end
return 1
