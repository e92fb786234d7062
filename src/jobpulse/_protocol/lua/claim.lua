--! include: _lib
--[[ claim.lua — a sweeper claims a stale job, atomically, exactly once; delivered until acked.

  KEYS[1..5] state, events, lease, alive, fence (see _lib.lua)
  ARGV[1] stream MAXLEN   ARGV[2] retention ms   ARGV[3] error text for the LOST snapshot

  A job is stale when its snapshot says RUNNING and both the liveness and the lease keys are
  gone. The claim bumps the fence (the old worker's writes are refused from now on), writes
  status LOST, the `claim` field (= the claim's fence: the unacknowledged-claim marker) and a
  `stale` stream entry, and gives the snapshot the retention TTL so that a new attempt can
  still resume from its last checkpoint.

  Returns {1, fence, claimed_ms, field, value, ...}: the claim, with the snapshot as it was
                   before it (status RUNNING). A job that is LOST with its `claim` marker still
                   set (nobody acknowledged it with ack.lua) answers the SAME claim again: same
                   fence and claimed_ms, nothing written; the snapshot is the stored one with
                   status RUNNING, error and finished_ms '' (fence and seq are the claim's).
                   That is at-least-once delivery, and it makes a replayed claim safe.
          {0} the job is not RUNNING (ended, acknowledged, unknown or expired): drop it from
                   the index,
          {-1, ms} the job is alive (liveness or lease present): not stale; ms is the
                   longer of the two keys' remaining PTTLs (0 for a key without a TTL), the
                   earliest moment it could become stale, so the sweeper can re-score it.

  Atomicity is the exactly-once argument: the check (RUNNING, no alive, no lease) and the
  change to LOST happen in one script, so of any number of concurrent claims of one attempt
  exactly one makes the claim (bumps the fence); every later one answers that same claim until
  it is acknowledged, then {0}. Only a new acquire (a new attempt, with a new fence, which also
  clears the marker) can make the job RUNNING, hence claimable, again.
]]
local h = redis.call('HMGET', KEYS[1], 'status', 'seq', 'fence', 'claim', 'finished_ms')
if h[1] == 'LOST' and h[4] then
  local reply = {1, tonumber(h[4]), tonumber(h[5]) or 0}
  local stored = redis.call('HGETALL', KEYS[1])
  local before = {status = 'RUNNING', error = '', finished_ms = ''}
  for i = 1, #stored, 2 do
    local name = stored[i]
    if name ~= 'claim' then
      reply[#reply + 1] = name
      reply[#reply + 1] = before[name] or stored[i + 1]
    end
  end
  return reply
end
if h[1] ~= 'RUNNING' then return {0} end
local alive_ms = redis.call('PTTL', KEYS[4])
local lease_ms = redis.call('PTTL', KEYS[3])
if alive_ms ~= -2 or lease_ms ~= -2 then return {-1, math.max(alive_ms, lease_ms, 0)} end

local before = redis.call('HGETALL', KEYS[1])
local fence = next_fence(h[3])
local now = now_ms()
redis.call('HSET', KEYS[1], 'status', 'LOST', 'fence', fence, 'seq', (tonumber(h[2]) or 0) + 1,
  'finished_ms', now, 'error', ARGV[3], 'claim', fence)
redis.call('HDEL', KEYS[1], 'cancel')
add_event(ARGV[1], 'stale', '', now)
local retention = tonumber(ARGV[2])
redis.call('PEXPIRE', KEYS[1], retention)
redis.call('PEXPIRE', KEYS[2], retention)
redis.call('PEXPIRE', KEYS[5], retention)
local reply = {1, fence, now}
for i = 1, #before do reply[#reply + 1] = before[i] end
return reply
