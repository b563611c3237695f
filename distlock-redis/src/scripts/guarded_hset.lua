-- HSET key field value, if the token is admitted (after guarded_rule.lua).
-- KEYS[1] the key's fence, KEYS[2] the key (a hash).
-- ARGV[1] the token, ARGV[2] its hold ('x' or 's'), ARGV[3] the field,
-- ARGV[4] the value.
-- Returns {1, n} when admitted and written (n: 1 for a new field, 0 for an
-- updated one), {0, highest} when refused; WRONGTYPE when the key is not a
-- hash (nothing written, the token not recorded).
local ok, top = guarded_check(KEYS[1], ARGV[1], ARGV[2])
if not ok then return {0, top} end
local n = redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
guarded_record(KEYS[1], ARGV[1], ARGV[2], top)
return {1, n}
