-- DEL key, if the token is admitted (after guarded_rule.lua). The fence
-- stays: deleting it would let a stale holder in again.
-- KEYS[1] the key's fence, KEYS[2] the key.
-- ARGV[1] the token, ARGV[2] its hold ('x' or 's').
-- Returns {1, n} when admitted (n: 1 when the key existed, else 0),
-- {0, highest} when refused.
local ok, top = guarded_check(KEYS[1], ARGV[1], ARGV[2])
if not ok then return {0, top} end
local n = redis.call('DEL', KEYS[2])
guarded_record(KEYS[1], ARGV[1], ARGV[2], top)
return {1, n}
