--[[ _lib.lua — helpers prepended (at load time, by scripts.py) to the scripts that declare
  "--! include: _lib". Redis has no Lua include, so the assembled text is what runs and what
  the tests exercise. Scripts that read the time include _clock first (now_ms, now_us).

  Every per-job script takes the same five keys:
    KEYS[1] state hash    KEYS[2] events stream    KEYS[3] lease string
    KEYS[4] alive string  KEYS[5] fence counter
]]

-- The dynamic snapshot fields, in the positional order the worker sends them.
local DYNAMIC = {'done', 'total', 'stage', 'rate', 'eta_s', 'rss_bytes', 'cpu_s', 'loop_lag_ms'}

--[[ Is (token, fence) still the owner of the job? Renews the lease when it is.
  Returns  1  lease held by us, renewed
           2  lease had expired (or Redis lost it) and nobody claimed the job: re-taken
           3  as 2, and the snapshot is gone too (a restart lost the data): resend static fields
          -1  the lease holds another owner's token (taken over)
          -2  the fence moved past ours, or the job already ended (fenced out)
]]
local function owner(token, fence, ttl_ms)
  local holder = redis.call('GET', KEYS[3])
  if holder == token then
    -- Nobody can move the fence while our lease exists: acquire and claim both require the
    -- lease to be gone. So the fast path (every beat) skips reading the fence.
    redis.call('PEXPIRE', KEYS[3], ttl_ms)
    return 1
  end
  if holder then return -1 end
  local current = redis.call('GET', KEYS[5])
  if current and tonumber(current) ~= fence then return -2 end
  local status = redis.call('HGET', KEYS[1], 'status')
  if status and status ~= 'RUNNING' then return -2 end
  redis.call('SET', KEYS[3], token, 'PX', ttl_ms)
  if not current then redis.call('SET', KEYS[5], fence) end
  if status then return 2 end
  return 3
end

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
  local stored = tonumber(redis.call('GET', KEYS[5]))
  local snap = tonumber(snapshot_fence)
  local fence = math.max(stored or 0, snap or 0) + 1
  if not stored and not snap then
    fence = math.max(fence, now_us())
  end
  redis.call('SET', KEYS[5], fence)
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
