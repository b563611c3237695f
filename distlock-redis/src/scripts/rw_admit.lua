-- The read-write lock's admission rule (a prelude of its acquire, release
-- and force scripts, before queue.lua). KEYS as rw_acquire.lua.
-- The waiters an attempt would admit right now, in queue order: nobody while
-- a writer holds; else the head of the queue if it is a writer and no reader
-- holds; else the run of readers at the head of the queue (up to the first
-- queued writer). Computed on the keys as they stand (expired holders and
-- dead waiters count until purged). Nobody when the queue is not a sorted set.
local function admissible()
  if redis.call('TYPE', KEYS[3])['ok'] ~= 'zset' then return {} end
  if redis.call('EXISTS', KEYS[1]) == 1 then return {} end
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not head then return {} end
  if string.sub(head, 1, 2) == 'w:' then
    if redis.pcall('ZCARD', KEYS[2]) == 0 then return {head} end
    return {}
  end
  local run = {}
  local from = 0
  while true do
    local chunk = redis.call('ZRANGE', KEYS[3], from, from + 63)
    for _, m in ipairs(chunk) do
      if string.sub(m, 1, 2) ~= 'r:' then return run end
      run[#run + 1] = m
    end
    if #chunk < 64 then return run end
    from = from + 64
  end
end
