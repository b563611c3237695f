-- What the mutex's lock key (prefix + name) can hold, once (a prelude:
-- defines functions only, no server call until one is called).
-- * a distlock hold (mutex, fair mutex, election): '<32 hex digits>|<owner
--   identity>', the attempt token and the holder's owner, built by the
--   client once per attempt and compared exactly (it is the holder
--   record: the token the holder took is the fencing counter's value
--   while it holds, see fence.lua);
-- * a hand-over reservation: 'distlock:handoff:<provider id>', set by a
--   release (PX a moment) for the first live provider in the plain mutex's
--   line; the lock is free, and every SET NX fails by itself meanwhile, so
--   only a failure path reads it (the reserved provider takes it, and so
--   may a try_lock, or any other kind: it is an order among waiters, not a
--   hold);
-- * another kind's marker, 'distlock:rw', 'distlock:semaphore',
--   'distlock:election' (kind.lua);
-- * anything else: a foreign hold (redis-py's 32 hex digits, a hand-set
--   value), or a hold of an earlier distlock version (its token alone, with
--   a {lock key}:holder hash beside it naming it).
local HANDOFF_PREFIX = 'distlock:handoff:'
local DISTLOCK_HOLD = '^' .. string.rep('%x', 32) .. '|'
-- The owner identity of a distlock hold `value`, else nil.
local function hold_owner(value)
  if type(value) ~= 'string' or not string.find(value, DISTLOCK_HOLD) then return nil end
  return string.sub(value, 34)
end
-- The provider a reservation `value` is for, else nil.
local function reserved_for(value)
  if type(value) ~= 'string' or string.sub(value, 1, #HANDOFF_PREFIX) ~= HANDOFF_PREFIX then
    return nil
  end
  return string.sub(value, #HANDOFF_PREFIX + 1)
end
