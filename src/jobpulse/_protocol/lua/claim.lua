--! include: _clock _lib
--[[ claim.lua — a sweeper claims a stale job, atomically, exactly once; delivered until acked.

  KEYS[1..4] state, events, alive, fence (see _lib.lua)
  ARGV[1] stream MAXLEN   ARGV[2] retention ms   ARGV[3] error text for the LOST snapshot
  ARGV[4] redelivery delay ms (default 60000)
  ARGV[5] the caller's claim token, unique per sweep call (default '')

  A job is stale when its snapshot says RUNNING and its `alive` key (liveness and lease in
  one) is gone. The claim bumps the fence (the old worker's writes are refused from now on), writes
  status LOST, the unacknowledged-claim marker (`claim` = the claim's fence, `claim_due_ms` =
  when it may be delivered again, `claim_token` = ARGV[5]) and a `stale` stream entry, and
  gives the snapshot the retention TTL so that a new attempt can still resume from its last
  checkpoint.

  Returns {1, fence, claimed_ms, field, value, ...}: the claim, with the snapshot as it was
                   before it (status RUNNING). While the marker is set (nobody acknowledged
                   the claim with ack.lua) the SAME claim is answered again, nothing else
                   written: at once to a replay of the same call (same token), and to any
                   caller once claim_due_ms has passed (then claim_due_ms moves on by ARGV[4]).
                   The snapshot of such an answer is the stored one with status RUNNING, error
                   and finished_ms '' (fence and seq are the claim's).
          {0} the job is not RUNNING (ended, acknowledged, unknown or expired): drop it from
                   the index,
          {-1, ms} not claimable for ms more: the job is alive (ms: the PTTL of `alive`, 0 for
                   a key without a TTL, the earliest moment it could
                   become stale), or its claim waits for its redelivery time. The sweeper
                   re-scores the entry.

  Atomicity is the exactly-once argument: the check (RUNNING, no alive) and the
  change to LOST happen in one script, so of any number of concurrent claims of one attempt
  exactly one makes the claim (bumps the fence) and gets it; the others are told to come back
  at claim_due_ms. Only a new acquire (a new attempt, with a new fence, which also clears the
  marker) can make the job RUNNING, hence claimable, again.
]]
local h = redis.call('HMGET', KEYS[1], 'status', 'seq', 'fence', 'claim', 'finished_ms',
                     'claim_due_ms', 'claim_token')
local redeliver = tonumber(ARGV[4]) or 60000
local token = ARGV[5] or ''
if h[1] == 'LOST' and h[4] then
  local now = now_ms()
  if h[7] ~= token then
    local due = tonumber(h[6]) or 0
    if now < due then return {-1, due - now} end
    redis.call('HSET', KEYS[1], 'claim_due_ms', now + redeliver, 'claim_token', token)
  end
  local reply = {1, tonumber(h[4]), tonumber(h[5]) or 0}
  local stored = redis.call('HGETALL', KEYS[1])
  local before = {status = 'RUNNING', error = '', finished_ms = ''}
  local marker = {claim = true, claim_due_ms = true, claim_token = true}
  for i = 1, #stored, 2 do
    local name = stored[i]
    if not marker[name] then
      reply[#reply + 1] = name
      reply[#reply + 1] = before[name] or stored[i + 1]
    end
  end
  return reply
end
if h[1] ~= 'RUNNING' then return {0} end
local alive_ms = redis.call('PTTL', KEYS[3])
if alive_ms ~= -2 then return {-1, math.max(alive_ms, 0)} end

local before = redis.call('HGETALL', KEYS[1])
local fence = next_fence(h[3])
local now = now_ms()
redis.call('HSET', KEYS[1], 'status', 'LOST', 'fence', fence, 'seq', (tonumber(h[2]) or 0) + 1,
  'finished_ms', now, 'error', ARGV[3], 'claim', fence, 'claim_due_ms', now + redeliver,
  'claim_token', token)
redis.call('HDEL', KEYS[1], 'cancel')
add_event(ARGV[1], 'stale', '', now)
local retention = tonumber(ARGV[2])
redis.call('PEXPIRE', KEYS[1], retention)
redis.call('PEXPIRE', KEYS[2], retention)
redis.call('PEXPIRE', KEYS[4], retention)
local reply = {1, fence, now}
for i = 1, #before do reply[#reply + 1] = before[i] end
return reply
