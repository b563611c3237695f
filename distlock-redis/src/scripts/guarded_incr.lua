-- INCRBY key by, if the token is admitted (after guarded_rule.lua).
-- KEYS[1] the key's fence, KEYS[2] the key.
-- ARGV[1] the token, ARGV[2] its hold ('x' or 's'), ARGV[3] the increment
-- (a signed 64-bit decimal).
-- Returns {1, value} when admitted (the value after the increment),
-- {0, highest} when refused; INCRBY's error when the key does not hold an
-- integer or the sum overflows (nothing written, the token not recorded).
local ok, top = guarded_check(KEYS[1], ARGV[1], ARGV[2])
if not ok then return {0, top} end
local v = redis.call('INCRBY', KEYS[2], ARGV[3])
guarded_record(KEYS[1], ARGV[1], ARGV[2], top)
return {1, v}
