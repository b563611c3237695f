-- Prelude (functions only): a renewal's answer once it has extended a
-- hold, the same for every kind.
-- asked(requests, hold, ttl): 3 when `hold` (a lock key's value, or a
-- queued hold's token) is marked in the requests-to-release hash
-- `requests` (request_release.lua), whose TTL is then kept at least `ttl`
-- ms, so the request lasts as long as the hold; 1 otherwise.
local function asked(requests, hold, ttl)
  if redis.pcall('HEXISTS', requests, hold) ~= 1 then return 1 end
  local left = redis.call('PTTL', requests)
  if left >= 0 and left < tonumber(ttl) then
    redis.call('PEXPIRE', requests, ttl)
  end
  return 3
end
