-- Keep a waiting provider's place in a plain mutex's line alive: its pub/sub
-- connection answered a health check, so it hears hand-overs for a while yet.
-- KEYS[1] the waiting providers ({lock key}:waiting), KEYS[2] the line's
-- liveness ({lock key}:waiting:alive, see line_pop.lua)
-- ARGV[1] this provider's id, ARGV[2] how long from now (ms) it stays alive
-- Returns 1 when the provider is in line (its deadline moved on), 0 when it
-- is not (nothing changed).
local place = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
if type(place) ~= 'string' then
  -- Not in line (or not a zset: nothing to keep).
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.pcall('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
return 1
