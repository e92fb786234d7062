--[[ _lib.lua — helpers prepended (at load time, by scripts.py) to the scripts that declare
  "--! include: _lib". Redis has no Lua include, so the assembled text is what runs and what
  the tests exercise. Scripts that read the time include _clock first (now_ms, now_us).

  Scripts that check the lease (beat, finish) include _owner before it.

  Every per-job script takes the same four keys (beat.lua: its own order, see its header):
    KEYS[1] state hash    KEYS[2] events stream    KEYS[3] alive string    KEYS[4] fence counter

  `alive` is the liveness key and the lease in one: its value is
  "<token>:<fence>:<seq>:<cancel>" (keys.py alive_value; docs/protocol.md), PX ttl: the owner,
  the snapshot's seq and its cancel flag (0 or 1), written by the scripts that write those
  (acquire, beat, cancel), so the beat's regular path reads them without the snapshot. Its
  absence while the snapshot says RUNNING means STALE; a value whose "<token>:<fence>:" is not
  the caller's means another owner holds the job.
]]

-- The dynamic snapshot fields, in the positional order the worker sends them.
local DYNAMIC = {'done', 'total', 'stage', 'rate', 'eta_s', 'rss_bytes', 'cpu_s', 'loop_lag_ms'}

-- Append to `args` the field/value pairs of the positional dynamic values ARGV[first ..
-- first+7], and progress_ms when `done` moved (old_done: the stored value).
local function dynamic_pairs(args, first, old_done, now)
  for i, name in ipairs(DYNAMIC) do
    args[#args + 1] = name
    args[#args + 1] = ARGV[first + i - 1]
  end
  if old_done ~= ARGV[first] then
    args[#args + 1] = 'progress_ms'
    args[#args + 1] = now
  end
  return args
end

--[[ The fence of a new attempt (acquire) or of a claim: above the stored counter and above the
  snapshot's fence. When both are gone (retention expired, or a restart lost them) nothing of
  the id's past can be read, so the fence starts at the server clock in microseconds, above
  every fence an earlier run of the id could have had (earlier runs started from a smaller
  clock, and a run adds one per attempt). So a job id's writes are ordered by (fence, seq) over
  its whole life. Sets the counter and returns the fence. ]]
local function next_fence(snapshot_fence)
  local stored = tonumber(redis.call('GET', KEYS[4]))
  local snap = tonumber(snapshot_fence)
  local fence = math.max(stored or 0, snap or 0) + 1
  if not stored and not snap then
    fence = math.max(fence, now_us())
  end
  redis.call('SET', KEYS[4], fence)
  return fence
end

-- XADD one checkpoint entry read back from the snapshot (with the attempt it belongs to;
-- job_kind: the job's kind, on start entries).
local function add_event(maxlen, kind, details, now, job_kind)
  local h = redis.call('HMGET', KEYS[1], 'status', 'stage', 'done', 'total', 'seq', 'fence',
                       'attempt')
  local entry = {'kind', kind, 'status', h[1] or '', 'stage', h[2] or '', 'done', h[3] or '',
                 'total', h[4] or '', 'seq', h[5] or '', 'fence', h[6] or '',
                 'attempt', h[7] or '', 'ts_ms', now}
  if details and details ~= '' then
    entry[#entry + 1] = 'details'
    entry[#entry + 1] = details
  end
  if job_kind and job_kind ~= '' then
    entry[#entry + 1] = 'job_kind'
    entry[#entry + 1] = job_kind
  end
  return redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', unpack(entry))
end
