--! include: _clock
--[[ enroll.lua — write a job's running-index entry before its acquire (an intent record).

  KEYS[1] the job's running-index shard (a sorted set; see KeySchema.index_for)
  ARGV[1] job id   ARGV[2] horizon ms (how far ahead of the server clock the deadline is)

  The deadline is max(now + horizon, current score + 1): it never moves back, and it always
  moves, so an entry written for an earlier attempt (by its worker, or by a sweeper that
  re-scored it) can never be mistaken for this one by a conditional removal (unindex.lua
  removes only scores <= what its caller read or wrote). Replay-safe: a replay moves the
  deadline on by at most a few ms.

  Returns the deadline now held (server ms): acquire.lua refuses to start after it.
]]
local deadline = now_ms() + tonumber(ARGV[2])
local current = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if current and current + 1 > deadline then deadline = current + 1 end
redis.call('ZADD', KEYS[1], deadline, ARGV[1])
return deadline
