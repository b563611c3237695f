-- SET key value, if the token is admitted (after guarded_rule.lua).
-- KEYS[1] the key's fence, KEYS[2] the key.
-- ARGV[1] the token, ARGV[2] its hold ('x' exclusive, 's' shared),
-- ARGV[3] the value.
-- Returns {1, 'OK'} when admitted and written, {0, highest} when refused
-- (highest: the number the token was compared with); an error reply when
-- the fence key is not a distlock fence (nothing written).
local ok, top = guarded_check(KEYS[1], ARGV[1], ARGV[2])
if not ok then return {0, top} end
redis.call('SET', KEYS[2], ARGV[3])
guarded_record(KEYS[1], ARGV[1], ARGV[2], top)
return {1, 'OK'}
