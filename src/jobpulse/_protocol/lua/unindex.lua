--[[ unindex.lua — remove running-jobs index entries, unless they were re-scored meanwhile.

  KEYS[1] one running-jobs index shard (a sorted set; see KeySchema.index)
  ARGV[1], ARGV[2], ... member, score pairs: each job id with the score the sweeper read

  A member is removed only when its score is still <= the score that was read. Between the
  sweeper's read and this call a new attempt may have started the job (acquire ZADDs a future
  deadline); a plain ZREM would drop that live entry, and a worker dying before its next index
  refresh would never be found. Deadlines only ever move forward, so "<= what was read" means
  "nobody touched it since".

  Returns the number of members removed.
]]
local removed = 0
for i = 1, #ARGV, 2 do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) <= tonumber(ARGV[i + 1]) then
    removed = removed + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return removed
