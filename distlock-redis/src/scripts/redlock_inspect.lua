-- Inspect one master's part of a Redlock: reads only.
-- KEYS[1] lock key, KEYS[2] holder record (hash: lock, fence, at, owner),
-- KEYS[3] this master's fencing counter
-- Returns {id, pttl, own, owner, fence, at, counter}:
--   id: SHA1 of the lock key's value ('' when free), so the client can tell
--       which masters hold the same value without seeing the value,
--   pttl: the key's PTTL (-1: no TTL), own: 1 when the holder record
--   belongs to the value (owner, fence and at are then the record's), 0
--   otherwise ('' for them), counter: the fencing counter ('' when unset);
-- {-1, index} when the key at that index has the wrong type.
local wants = {'string', 'hash', 'string'}
for i, want in ipairs(wants) do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'none' and t ~= want then return {-1, i} end
end
local counter = redis.call('GET', KEYS[3]) or ''
local value = redis.call('GET', KEYS[1])
if not value then
  return {'', 0, 0, '', '', '', counter}
end
local pttl = redis.call('PTTL', KEYS[1])
local record = redis.call('HMGET', KEYS[2], 'lock', 'fence', 'at', 'owner')
if record[1] == value then
  return {redis.sha1hex(value), pttl, 1, record[4] or '', record[2] or '', record[3] or '', counter}
end
return {redis.sha1hex(value), pttl, 0, '', '', '', counter}
