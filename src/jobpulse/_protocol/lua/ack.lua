--! include: _lib
--[[ ack.lua — acknowledge a claim: its StaleJob was handled, stop delivering it.

  KEYS[1..4] state, events, alive, fence (see _lib.lua)
  ARGV[1] the claim's fence (StaleJob.fence)

  Clears the unacknowledged-claim marker claim.lua wrote (`claim`, `claim_due_ms`,
  `claim_token`) when it still names this claim. The job's index entry is left to the sweeper, whose next meeting
  with it (claim.lua answers "not running") removes it conditionally (unindex.lua).
  Replay-safe: a second ack finds no marker.

  Returns 1 acknowledged (now, or before: a replay, the snapshot still holds this claim's
  fence); 0 nothing to acknowledge (a new attempt started, or the snapshot expired).
]]
local h = redis.call('HMGET', KEYS[1], 'claim', 'fence')
local fence = tonumber(ARGV[1])
if h[1] and tonumber(h[1]) == fence then
  redis.call('HDEL', KEYS[1], 'claim', 'claim_due_ms', 'claim_token')
  return 1
end
if not h[1] and tonumber(h[2]) == fence then return 1 end
return 0
