--! include: _clock
--[[ tally.lua — a sweeper's mark: when it last swept, and how many jobs it claimed per kind.

  KEYS[1] ns:{#stats}         a Hash: sweep_ms, claims:<kind>
  KEYS[2] ns:{#stats}:claims  a sorted set of claims already counted (member "job fence",
                              score the claim's server ms), trimmed to the last 24 hours
  ARGV[1], ARGV[2], ... kind, token pairs: one per claim; token = "<job_id> <fence>"

  Sets sweep_ms to the server time. Counts a claim only once: replaying the same arguments
  (a client retry) counts nothing twice, since a (job, fence) pair is claimed at most once.

  Returns the server time in ms.
]]
local now = now_ms()
redis.call('HSET', KEYS[1], 'sweep_ms', now)
for i = 1, #ARGV, 2 do
  if redis.call('ZADD', KEYS[2], 'NX', now, ARGV[i + 1]) == 1 then
    redis.call('HINCRBY', KEYS[1], 'claims:' .. ARGV[i], 1)
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - 86400000)
return now
