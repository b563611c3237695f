-- Read an election's leader record and how long it has left.
-- KEYS[1] leader record ({prefix + name}:elect:leader, '<term> <candidate>')
-- Returns {record or false, PTTL in ms (-2: no record, -1: no TTL)},
--         {-1} when the key is not a string.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'string' then
  return {-1}
end
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
