--! include: _clock _lib
--[[ beat.lua — one heartbeat: renew, snapshot, liveness and (sometimes) a checkpoint entry.

  KEYS[1..5] state, events, lease, alive, fence (see _lib.lua)
  ARGV[1] owner token   ARGV[2] fence   ARGV[3] ttl ms   ARGV[4] seq
  ARGV[5] event kind, or '' for no stream entry     ARGV[6] event details JSON or ''
  ARGV[7] stream MAXLEN
  ARGV[8..15] done total stage rate eta_s rss_bytes cpu_s loop_lag_ms (positional)
  ARGV[16..] optional field, value pairs (static fields, resent after a data loss)

  Returns {code, cancel, now_ms, snapshot_seq}
    code  1 written; 2 written, lease re-taken after it expired; 3 written into an empty
          snapshot (a restart lost the data): the worker must resend its static fields;
          0 lease renewed but the snapshot holds a seq > ours (nothing else written);
          a replay of a beat that was written (same seq) answers as written (1, or 1 for a
          first run that was 2 or 3), writing nothing again;
          -1 taken over; -2 fenced out (nothing written in either case)
    cancel 1 when a cancel was requested for the job
]]
local fence = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local seq = tonumber(ARGV[4])
local code = owner(ARGV[1], fence, ttl)
if code < 0 then return {code, 0, 0, 0} end

redis.call('SET', KEYS[4], fence, 'PX', ttl)
local h = redis.call('HMGET', KEYS[1], 'seq', 'cancel', 'done')
local now = now_ms()
local current = tonumber(h[1]) or 0
local cancel = 0
if h[2] == '1' then cancel = 1 end
if seq < current then return {0, cancel, now, current} end
-- Replay-safe: only this lease's owner writes seq while it holds the lease, so an equal seq is
-- this very beat run again (a client retry after a lost reply): answer as the first run did.
if seq == current then return {code, cancel, now, seq} end

-- One HSET: the dynamic values (positional), seq, the times, and what a re-take restores.
local args = dynamic_pairs({'seq', seq, 'heartbeat_ms', now}, 8, h[3], now)
if code ~= 1 then
  args[#args + 1] = 'status'
  args[#args + 1] = 'RUNNING'
  args[#args + 1] = 'fence'
  args[#args + 1] = fence
end
for i = 16, #ARGV do args[#args + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(args))
if ARGV[5] ~= '' then
  local entry = {'kind', ARGV[5], 'status', 'RUNNING', 'stage', ARGV[10], 'done', ARGV[8],
                 'total', ARGV[9], 'seq', seq, 'fence', fence, 'ts_ms', now}
  if ARGV[6] ~= '' then
    entry[#entry + 1] = 'details'
    entry[#entry + 1] = ARGV[6]
  end
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[7], '*', unpack(entry))
end
return {code, cancel, now, seq}
