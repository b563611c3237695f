-- Admits the token without a write (after guarded_rule.lua): a barrier,
-- every lower token is refused from now on.
-- KEYS[1] the fence.
-- ARGV[1] the token, ARGV[2] its hold ('x' or 's').
-- Returns {1, token, exclusive} when admitted (the fence's fields after
-- it), {0, highest} when refused.
local ok, top = guarded_check(KEYS[1], ARGV[1], ARGV[2])
if not ok then return {0, top} end
guarded_record(KEYS[1], ARGV[1], ARGV[2], top)
local h = redis.call('HMGET', KEYS[1], 'token', 'exclusive')
return {1, h[1] or '0', h[2] or '0'}
