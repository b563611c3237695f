-- The frame of a user's script run only if the token is admitted (after
-- guarded_rule.lua; the user's body is put in place of the marker line
-- below, as the body of a function of KEYS and ARGV).
-- KEYS[1] the resource's fence, KEYS[2..] the user's keys (KEYS[1..] to
-- the body).
-- ARGV[1] the token, ARGV[2] its hold ('x' or 's'), ARGV[3..] the user's
-- arguments (ARGV[1..] to the body).
-- Returns {1, reply} when admitted and the body returned `reply` (an error
-- reply of the body is returned as it is, and the token not recorded),
-- {0, highest} when refused (the body not run).
local guarded_user = function(KEYS, ARGV)
-- distlock: the user's body
end
local ok, top = guarded_check(KEYS[1], ARGV[1], ARGV[2])
if not ok then return {0, top} end
local keys, args = {}, {}
for i = 2, #KEYS do keys[i - 1] = KEYS[i] end
for i = 3, #ARGV do args[i - 2] = ARGV[i] end
local reply = guarded_user(keys, args)
if type(reply) == 'table' and reply.err then return reply end
guarded_record(KEYS[1], ARGV[1], ARGV[2], top)
return {1, reply}
