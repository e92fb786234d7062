--! include: _clock _owner _lib
--[[ finish.lua — the final write and the release, owner-checked, written once.

  KEYS[1..5] state, events, lease, alive, fence (see _lib.lua)
  ARGV[1] owner token   ARGV[2] fence   ARGV[3] ttl ms   ARGV[4] seq
  ARGV[5] final status (COMPLETED, FAILED, CANCELLED or LOST)   ARGV[6] error text or ''
  ARGV[7] stream MAXLEN   ARGV[8] retention ms   ARGV[9] end details JSON or ''
  ARGV[10..17] done total stage rate eta_s rss_bytes cpu_s loop_lag_ms (positional)
  ARGV[18..] optional field, value pairs (static fields, resent after a data loss)

  Returns {code, now_ms}
    code 1 written; 0 the job had already ended (nothing written; also the answer to a retry
         of our own final write whose first reply was lost);
         -1 taken over; -2 fenced out (nothing written)
]]
local fence = tonumber(ARGV[2])
-- Idempotent: a retry after an ambiguous failure (the reply was lost) finds the job ended under
-- our own fence — only the fence holder writes a terminal state — and answers "already ended".
local ended = redis.call('HMGET', KEYS[1], 'status', 'fence')
if ended[1] and ended[1] ~= 'RUNNING' and tonumber(ended[2]) == fence then return {0, 0} end
local code = owner(ARGV[1], fence, tonumber(ARGV[3]), 0)
if code < 0 then return {code, 0} end
local h = redis.call('HMGET', KEYS[1], 'status', 'seq', 'done')
if h[1] and h[1] ~= 'RUNNING' then return {0, 0} end

local now = now_ms()
local seq = math.max(tonumber(ARGV[4]), (tonumber(h[2]) or 0) + 1)
local args = {'status', ARGV[5], 'error', ARGV[6], 'seq', seq, 'fence', fence,
              'finished_ms', now, 'heartbeat_ms', now}
dynamic_pairs(args, 10, h[3], now)
for i = 18, #ARGV do args[#args + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(args))
redis.call('HDEL', KEYS[1], 'cancel')
add_event(ARGV[7], 'end', ARGV[9], now)
redis.call('DEL', KEYS[3], KEYS[4])
local retention = tonumber(ARGV[8])
redis.call('PEXPIRE', KEYS[1], retention)
redis.call('PEXPIRE', KEYS[2], retention)
redis.call('PEXPIRE', KEYS[5], retention)
return {1, now}
