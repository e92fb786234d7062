--! include: _clock _owner
--[[ beat.lua — the heartbeats of one or more jobs (a batch): for each, renew, snapshot,
  liveness and (sometimes) a checkpoint entry. Every job is checked on its own (owner, fence,
  seq) and answered on its own; the server time is read once for the whole batch.

  KEYS  2 to 4 per job, in this order (not _lib.lua's): state, alive, events, fence: every key
        (all 4) unless the job's `n` is negative; then only state and alive, plus events when
        the beat carries a stream entry (its names end with '+'). A beat with a negative `n`
        that needs the fence (alive missing: a re-take reads it, and may write it) answers -3
        before any write, and the worker sends that beat again at once with every key and the
        same seq. Job j's keys follow job j-1's; all in one hash slot on a cluster (a batch
        there is one job, or jobs whose ids share a slot). No key is touched unless it was sent.
  ARGV  one segment per job, in the order of the keys:
    n      how many arguments of this job follow (the segment's length after n); negative
           (-length) when the job sent only the keys its regular path touches (see KEYS)
    token  fence  ttl_ms  seq
    landed the highest seq the worker knows the snapshot holds (its last beat answered written,
           or the acquire's), or 0 when this beat carries every field and the static ones
           (nothing to check: it repairs whatever the snapshot lost)
    names  which dynamic fields follow: a string of digits 1-8 naming, in order, the fields
           of FIELDS below whose values come next (the worker sends only the fields that
           differ from what it knows the snapshot holds: all of them after a data loss); a
           leading '~' means `done` is sent but may equal the stored value (the worker does
           not know what the snapshot holds: after its acquire, a failed beat, a resend), so
           progress_ms moves only if it differs; a leading '=' means `done` is sent unchanged
           (a beat with an entry sends it), so progress_ms stays; with neither a `done` sent
           is a `done` that moved (the slow path compares with the stored value in every
           case); a trailing '+' means a stream entry: three more arguments follow the values,
           event kind, details JSON or '', stream MAXLEN (the worker sends done, total and
           stage with an entry)
    values ...
    then optional field, value pairs (static fields, resent after a data loss; the checkpoint)

  Returns an array, one element per job:
    an integer now_ms * 8 + code * 2 + cancel (code 1, 2 or 3), or the code alone when
    refused (-1, -2) or sent back (-3), or {0, cancel, now_ms, snapshot_seq} when the snapshot holds a seq > ours
    (lease renewed, nothing else written), or an error reply when a command failed for this
    job (the others are unaffected):
    code  1 written; 2 written, lease re-taken after it expired;
          3 the snapshot's seq is below `landed` (or there is no snapshot): a restart or a
          failover lost writes the worker saw land (an empty snapshot, an older RDB, a replica
          that missed the last writes). Lease and liveness are renewed, status and fence
          restored (so a sweeper can claim the job), nothing of this beat is written (no
          field, no seq, no entry): the worker sends every field and the static ones at once,
          with landed 0. A replay finds the same snapshot and answers 3 again. Also when
          the snapshot alone was lost while alive lived on (deleted, evicted): the
          regular path's HSET then adds `seq`, and the beat is undone before answering 3
          (alive's cancel flag is written back into the snapshot, here and on the slow path);
          a replay of a beat that was written (same seq) answers as written (1), writing
          nothing again;
          -1 taken over; -2 fenced out (nothing written in either case);
          -3 resend with every key: the beat sent only state and alive (and events), but alive
             is missing, so the fence must be read (a re-take). Nothing was written (answered
             before any write, and before the snapshot is read); a replay answers -3 again
             while alive is missing. The worker resends the beat at once, same seq, every key
    cancel 1 when a cancel was requested for the job

  `alive` carries the snapshot's seq and the cancel flag ("<token>:<fence>:<seq>:<cancel>",
  written by the same scripts that write the snapshot's seq and cancel, so a restart or a
  failover restores the two together). The regular path (alive holds our token and fence,
  landed > 0) reads them there: GETEX alive (a GET that counts as a write: see _owner.lua),
  one HSET, SET alive (the new seq, PX ttl); TIME once per call, first. The slow path (alive
  missing: a re-take, sent with every key; landed 0: a full resend) reads the snapshot's seq,
  cancel and done with one HMGET, as the check against them.
]]
local FIELDS = {'done', 'total', 'stage', 'rate', 'eta_s', 'rss_bytes', 'cpu_s', 'loop_lag_ms'}
local now = now_ms()

-- The beat of the job whose keys start after KEYS[k] (state, alive, events, fence; `every`:
-- all four were sent, else events only with an entry, and no fence) and whose segment is
-- ARGV[a .. last].
local function beat(k, every, a, last)
  local fence = ARGV[a + 1]
  local ttl = ARGV[a + 2]
  local seq = tonumber(ARGV[a + 3])
  local landed = tonumber(ARGV[a + 4])
  local held = redis.call('GETEX', KEYS[k + 2]) -- alive (GETEX: see _owner.lua)
  -- a re-take reads (and may write) the fence, which this beat did not send: before any write
  if not held and not every then return -3 end
  local code = owner(ARGV[a], fence, k, held)
  if code < 0 then return code end

  local prefix = ARGV[a] .. ':' .. fence .. ':'
  local current, cancel, stored_done, restore_cancel
  if code == 1 and landed > 0 then -- the regular path: seq and cancel from alive
    local s, c = string.match(held, '^(%d+):([01])$', #prefix + 1)
    current, cancel = tonumber(s), tonumber(c)
  end
  local fast = current ~= nil
  if not fast then -- a re-take, a full resend: check against the snapshot
    local h = redis.call('HMGET', KEYS[k + 1], 'seq', 'cancel', 'done')
    current = tonumber(h[1]) or 0
    cancel = 0
    if h[2] == '1' then cancel = 1 end
    stored_done = h[3]
    -- alive's cancel flag outlives a snapshot lost alone (cancel.lua writes both): keep it
    if cancel == 0 and code == 1 and string.sub(held, -2) == ':1' then
      cancel = 1
      restore_cancel = true
    end
  end

  local function renew(at) -- alive: our token and fence, the snapshot's seq, cancel; PX ttl
    redis.call('SET', KEYS[k + 2], prefix .. at .. ':' .. cancel, 'PX', ttl)
  end
  if seq < current then
    renew(current)
    return {0, cancel, now, current}
  end
  if current < landed then
    -- writes the worker saw land are gone: write nothing of this beat (so its replay finds
    -- the same snapshot and answers the same), keep the job RUNNING and claimable
    redis.call('HSET', KEYS[k + 1], 'status', 'RUNNING', 'fence', fence)
    renew(current)
    return now * 8 + 6 + cancel
  end
  -- Replay-safe: only this lease's owner writes seq while it holds the lease, so an equal seq
  -- is this very beat run again (a client retry after a lost reply): answer as the first run.
  if seq == current then
    renew(current)
    return now * 8 + 2 + cancel
  end

  -- One HSET: seq, the time, the fields sent, progress_ms when done moved, what a re-take
  -- restores, and the pairs after the values.
  local args = {'seq', ARGV[a + 3], 'heartbeat_ms', now}
  local names = ARGV[a + 5]
  local n = #names
  local first = 1
  local mark = string.byte(names, 1)
  local compare = mark == 126 -- '~': done may equal the stored value
  local still = mark == 61 -- '=': done is sent unchanged
  if compare or still then first = 2 end
  local event = string.byte(names, n) == 43 -- '+'
  if event then n = n - 1 end
  local at = a + 6
  local done, total, stage
  for i = first, n do
    local field = FIELDS[string.byte(names, i) - 48]
    local value = ARGV[at]
    args[#args + 1] = field
    args[#args + 1] = value
    if field == 'done' then
      done = value
      local moved
      if not fast then
        moved = value ~= stored_done
      elseif compare then
        moved = value ~= redis.call('HGET', KEYS[k + 1], 'done')
      else
        moved = not still
      end
      if moved then
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
    args[#args + 1] = fence
  end
  if restore_cancel then
    args[#args + 1] = 'cancel'
    args[#args + 1] = '1'
  end
  for i = first_pair, last do args[#args + 1] = ARGV[i] end
  local added = redis.call('HSET', KEYS[k + 1], unpack(args))
  if fast and added > #args / 2 - 2 then
    -- `seq` or `heartbeat_ms` was not there: the snapshot was lost alone (deleted, evicted)
    -- while alive lived on, which the regular path cannot see before writing. Undo this beat
    -- (the partial snapshot goes) and answer as for a lost snapshot: RUNNING, the fence and
    -- a cancel request (alive's flag) restored, alive's seq kept, code 3; a replay finds the
    -- same and answers the same. Costs the regular path nothing: HSET says how many fields it
    -- added.
    redis.call('DEL', KEYS[k + 1])
    redis.call('HSET', KEYS[k + 1], 'status', 'RUNNING', 'fence', fence)
    if cancel == 1 then redis.call('HSET', KEYS[k + 1], 'cancel', '1') end
    renew(current)
    return now * 8 + 6 + cancel
  end
  renew(ARGV[a + 3]) -- after the HSET: a failed HSET leaves alive's seq as it was
  if event then
    -- (the worker sends done, total and stage with an entry; read back any it did not)
    if not (done and total and stage) then
      local back = redis.call('HMGET', KEYS[k + 1], 'done', 'total', 'stage')
      done, total, stage = done or back[1] or '', total or back[2] or '', stage or back[3] or ''
    end
    local entry = {'kind', ARGV[at], 'status', 'RUNNING', 'stage', stage, 'done', done,
                   'total', total, 'seq', ARGV[a + 3], 'fence', fence, 'ts_ms', now}
    if ARGV[at + 1] ~= '' then
      entry[#entry + 1] = 'details'
      entry[#entry + 1] = ARGV[at + 1]
    end
    redis.call('XADD', KEYS[k + 3], 'MAXLEN', '~', ARGV[at + 2], '*', unpack(entry))
  end
  if code == 3 then code = 2 end -- a beat of every field, into an empty snapshot: re-taken
  return now * 8 + code * 2 + cancel
end

local out = {}
local a, k, j = 1, 0, 1
while k < #KEYS do -- (not #ARGV: argument time appends the clock after the last segment)
  local n = tonumber(ARGV[a])
  local every, count = n > 0, 4
  if not every then
    n = -n
    count = 2
    if string.byte(ARGV[a + 6], -1) == 43 then count = 3 end -- '+': an entry, events sent
  end
  local ok, reply = pcall(beat, k, every, a + 1, a + n)
  if ok then
    out[j] = reply
  else -- a failed command of this job (its earlier writes stay: the worker resends them)
    out[j] = redis.error_reply(tostring(reply.err or reply))
  end
  a, k, j = a + n + 1, k + count, j + 1
end
return out
