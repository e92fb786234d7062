--! include: _clock _owner
--[[ beat.lua — one heartbeat: renew, snapshot, liveness and (sometimes) a checkpoint entry.

  KEYS[1..5] state, events, lease, alive, fence (see _lib.lua)
  ARGV[1] owner token   ARGV[2] fence   ARGV[3] ttl ms   ARGV[4] seq
  ARGV[5] which dynamic fields follow: a string of digits 1-8 naming, in order, the fields of
          FIELDS below whose values are ARGV[6 ..] (the worker sends only the fields that
          differ from the last snapshot it knows was written; all of them after a data loss);
          a trailing '+' means a stream entry: three more arguments follow the values,
          event kind, details JSON or '', stream MAXLEN (an entry's beat always names the
          digits 1 2 3: done, total and stage go into the entry)
  then optional field, value pairs (static fields, resent after a data loss; the checkpoint)

  Returns one integer, now_ms * 8 + code * 2 + cancel, when the beat was written or renewed
  (code 1, 2 or 3; 0 only in the array below), or the code alone when refused (-1, -2):
    code  1 written; 2 written, lease re-taken after it expired; 3 written into an empty
          snapshot (a restart lost the data): the worker must resend every field;
          a replay of a beat that was written (same seq) answers as written (1), writing
          nothing again;
          -1 taken over; -2 fenced out (nothing written in either case)
    cancel 1 when a cancel was requested for the job
  or, when the snapshot holds a seq > ours (lease renewed, nothing else written), the array
  {0, cancel, now_ms, snapshot_seq}.

  Calls on the regular path: GET + PEXPIRE (lease), SET (alive), HMGET, HSET; TIME first.
]]
local FIELDS = {'done', 'total', 'stage', 'rate', 'eta_s', 'rss_bytes', 'cpu_s', 'loop_lag_ms'}
local fence = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local seq = tonumber(ARGV[4])
local code = owner(ARGV[1], fence, ttl)
if code < 0 then return code end

redis.call('SET', KEYS[4], ARGV[2], 'PX', ttl)
local h = redis.call('HMGET', KEYS[1], 'seq', 'cancel', 'done')
local now = now_ms()
local current = tonumber(h[1]) or 0
local cancel = 0
if h[2] == '1' then cancel = 1 end
if seq < current then return {0, cancel, now, current} end
-- Replay-safe: only this lease's owner writes seq while it holds the lease, so an equal seq is
-- this very beat run again (a client retry after a lost reply): answer as the first run did.
if seq == current then return now * 8 + 2 + cancel end

-- One HSET: seq, the time, the fields sent, progress_ms when done moved, what a re-take
-- restores, and the pairs after the values.
local args = {'seq', ARGV[4], 'heartbeat_ms', now}
local names = ARGV[5]
local n = #names
local event = string.byte(names, n) == 43 -- '+'
if event then n = n - 1 end
local at = 6
local done, total, stage
for i = 1, n do
  local field = FIELDS[string.byte(names, i) - 48]
  local value = ARGV[at]
  args[#args + 1] = field
  args[#args + 1] = value
  if field == 'done' then
    done = value
    if value ~= h[3] then
      args[#args + 1] = 'progress_ms'
      args[#args + 1] = now
    end
  elseif field == 'total' then
    total = value
  elseif field == 'stage' then
    stage = value
  end
  at = at + 1
end
local first_pair = at
if event then first_pair = at + 3 end
if code ~= 1 then
  args[#args + 1] = 'status'
  args[#args + 1] = 'RUNNING'
  args[#args + 1] = 'fence'
  args[#args + 1] = ARGV[2]
end
for i = first_pair, #ARGV do args[#args + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(args))
if event then
  -- (the worker always sends done, total and stage with an entry; read back any it did not)
  if not (done and total and stage) then
    local back = redis.call('HMGET', KEYS[1], 'done', 'total', 'stage')
    done, total, stage = done or back[1] or '', total or back[2] or '', stage or back[3] or ''
  end
  local entry = {'kind', ARGV[at], 'status', 'RUNNING', 'stage', stage, 'done', done,
                 'total', total, 'seq', ARGV[4], 'fence', ARGV[2], 'ts_ms', now}
  if ARGV[at + 1] ~= '' then
    entry[#entry + 1] = 'details'
    entry[#entry + 1] = ARGV[at + 1]
  end
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[at + 2], '*', unpack(entry))
end
return now * 8 + code * 2 + cancel
