--! include: _clock _lib
--[[ acquire.lua — take a job's lease and start an attempt.

  KEYS[1..4] state, events, alive, fence (see _lib.lua)
  ARGV[1] owner token       ARGV[2] ttl ms          ARGV[3] stream MAXLEN
  ARGV[4] worker name       ARGV[5] total or ''     ARGV[6] meta JSON or ''
  ARGV[7] start details JSON or ''   ARGV[8] job kind or ''
  ARGV[9] the latest start (server ms): the running-index deadline enroll.lua wrote just
          before, less a margin for clock skew between nodes; or '' (no limit)

  Looks at `alive` (the lease) BEFORE bumping the fence, so a refused attempt never fences out
  the owner.
  A previous attempt that is RUNNING with no liveness (stale) or LOST is resumed: attempt + 1,
  its last checkpoint returned. Otherwise the job starts afresh (attempt still counts up while
  the old snapshot exists). The events stream is never deleted: every attempt appends to it,
  opening with a `start` entry; entries carry `fence` (and `attempt`), so readers tell the
  attempts apart. seq continues from the old snapshot; the fence comes from next_fence.

  Findable from the start: the worker writes the index entry (enroll.lua) BEFORE this script.
  A call that arrives so late that the sweeper may already have dropped that entry (after
  ARGV[9]) starts nothing, so a RUNNING job always has an index entry.

  Replay-safe: a call that finds its own token in `alive` (a client retry of a call that
  already ran) answers the attempt it started, unchanged.

  Returns {1, fence, attempt, seq, resume_from JSON or '', started_ms}, {0} busy (another live
  worker holds the job), {-1} too late (the index entry may be gone): nothing written.
]]
local holder = redis.call('GET', KEYS[3])
local ours = ARGV[1] .. ':'
if holder and string.sub(holder, 1, #ours) == ours then
  local r = redis.call('HMGET', KEYS[1], 'status', 'fence', 'attempt', 'seq', 'checkpoint',
                       'started_ms')
  if r[1] == 'RUNNING' and r[2] then
    return {1, tonumber(r[2]), tonumber(r[3]), tonumber(r[4]), r[5] or '', tonumber(r[6])}
  end
end
if holder then return {0} end -- alive: another worker holds the job
local h = redis.call('HMGET', KEYS[1], 'status', 'attempt', 'seq', 'checkpoint', 'fence')

local now = now_ms()
local ttl = tonumber(ARGV[2])
if ARGV[9] and ARGV[9] ~= '' and now > tonumber(ARGV[9]) then return {-1} end

local fence = next_fence(h[5])
redis.call('PERSIST', KEYS[4])
local attempt = (tonumber(h[2]) or 0) + 1
local seq = (tonumber(h[3]) or 0) + 1
local resume = ''
if (h[1] == 'RUNNING' or h[1] == 'LOST') and h[4] then resume = h[4] end

redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'status', 'RUNNING', 'stage', '', 'done', 0, 'total', ARGV[5],
  'rate', '', 'eta_s', '', 'rss_bytes', '', 'cpu_s', '', 'loop_lag_ms', '', 'seq', seq,
  'fence', fence, 'attempt', attempt, 'worker', ARGV[4], 'started_ms', now,
  'heartbeat_ms', now, 'progress_ms', now, 'finished_ms', '', 'error', '', 'meta', ARGV[6],
  'kind', ARGV[8])
if resume ~= '' then redis.call('HSET', KEYS[1], 'checkpoint', resume) end
redis.call('SET', KEYS[3], ARGV[1] .. ':' .. string.format('%.0f', fence) .. ':' .. seq .. ':0',
           'PX', ttl)
redis.call('PERSIST', KEYS[2])
add_event(ARGV[3], 'start', ARGV[7], now, ARGV[8])
return {1, fence, attempt, seq, resume, now}
