--! include: _clock _owner _lib
--[[ finish.lua — the final write and the release, owner-checked, written once.

  KEYS[1..4] state, events, alive, fence (see _lib.lua)
  ARGV[1] owner token   ARGV[2] fence   ARGV[3] ttl ms (unused: alive is deleted)   ARGV[4] seq
  ARGV[5] final status (COMPLETED, FAILED, CANCELLED or LOST)   ARGV[6] error text or ''
  ARGV[7] stream MAXLEN   ARGV[8] retention ms   ARGV[9] end details JSON or ''
  ARGV[10..17] done total stage rate eta_s rss_bytes cpu_s loop_lag_ms (positional)
  ARGV[18..] optional field, value pairs (static fields, resent after a data loss)

  Returns {code, now_ms}
    code 1 written; 0 the job had already ended (nothing written; also the answer to a retry
         of our own final write whose first reply was lost, also after a new attempt of the
         job id started, or ended, in between);
         -1 taken over; -2 fenced out (nothing written)
]]
local fence = tonumber(ARGV[2])

-- Is our final write already in the events stream (its `end` entry carries our fence)? Read
-- from the newest entry back, a page at a time, until our attempt's `start` entry or an entry
-- of an older fence (entries are in fence order). Only on a refusal whose snapshot holds a
-- newer fence (rare): the regular final write reads nothing of the stream.
local function ended_by_us()
  local from = '+'
  while true do
    local page = redis.call('XREVRANGE', KEYS[2], from, '-', 'COUNT', 64)
    for _, entry in ipairs(page) do
      local f = entry[2]
      local kind, at
      for i = 1, #f, 2 do
        if f[i] == 'kind' then kind = f[i + 1] elseif f[i] == 'fence' then at = f[i + 1] end
      end
      at = tonumber(at)
      if at and at < fence then return false end
      if at == fence then
        if kind == 'end' then return true end
        if kind == 'start' then return false end -- our attempt's first entry: no end after it
      end
    end
    if #page < 64 then return false end
    from = '(' .. page[#page][1]
  end
end

-- Idempotent: a retry after an ambiguous failure (the reply was lost) finds the job ended under
-- our own fence — only the fence holder writes a terminal state — and answers "already ended";
-- if a new attempt started since (the job had ended, so nothing held it back), the snapshot
-- and `alive` are the new attempt's, and our `end` entry in the stream says we wrote it.
local ended = redis.call('HMGET', KEYS[1], 'status', 'fence')
if ended[1] and ended[1] ~= 'RUNNING' and tonumber(ended[2]) == fence then return {0, 0} end
local code = owner(ARGV[1], ARGV[2], 0, redis.call('GETEX', KEYS[3])) -- see _owner.lua
if code < 0 then
  if tonumber(ended[2]) and tonumber(ended[2]) > fence and ended_by_us() then return {0, 0} end
  return {code, 0}
end
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
redis.call('DEL', KEYS[3])
local retention = tonumber(ARGV[8])
redis.call('PEXPIRE', KEYS[1], retention)
redis.call('PEXPIRE', KEYS[2], retention)
redis.call('PEXPIRE', KEYS[4], retention)
return {1, now}
