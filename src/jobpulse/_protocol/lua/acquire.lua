--! include: _lib
--[[ acquire.lua — take a job's lease and start an attempt.

  KEYS[1..5] state, events, lease, alive, fence (see _lib.lua)
  ARGV[1] owner token       ARGV[2] ttl ms          ARGV[3] stream MAXLEN
  ARGV[4] worker name       ARGV[5] total or ''     ARGV[6] meta JSON or ''
  ARGV[7] start details JSON or ''   ARGV[8] job kind or ''

  Looks at the lease BEFORE bumping the fence, so a refused attempt never fences out the owner.
  A previous attempt that is RUNNING with no liveness (stale) or LOST is resumed: attempt + 1,
  its last checkpoint returned, its event history kept. Otherwise the job starts afresh
  (attempt still counts up while the old snapshot exists). seq continues from the old snapshot.

  Returns {1, fence, attempt, seq, resume_from JSON or '', now_ms} or {0} when busy.
]]
if redis.call('EXISTS', KEYS[3]) == 1 then return {0} end
local h = redis.call('HMGET', KEYS[1], 'status', 'attempt', 'seq', 'checkpoint', 'fence')
if h[1] == 'RUNNING' and redis.call('EXISTS', KEYS[4]) == 1 then return {0} end

local fence = redis.call('INCR', KEYS[5])
if tonumber(h[5]) and fence <= tonumber(h[5]) then
  fence = tonumber(h[5]) + 1
  redis.call('SET', KEYS[5], fence)
end
redis.call('PERSIST', KEYS[5])
local attempt = (tonumber(h[2]) or 0) + 1
local seq = (tonumber(h[3]) or 0) + 1
local resume = ''
if (h[1] == 'RUNNING' or h[1] == 'LOST') and h[4] then
  resume = h[4]
else
  redis.call('DEL', KEYS[2])
end

local now = now_ms()
local ttl = tonumber(ARGV[2])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'status', 'RUNNING', 'stage', '', 'done', 0, 'total', ARGV[5],
  'rate', '', 'eta_s', '', 'rss_bytes', '', 'cpu_s', '', 'loop_lag_ms', '', 'seq', seq,
  'fence', fence, 'attempt', attempt, 'worker', ARGV[4], 'started_ms', now,
  'heartbeat_ms', now, 'progress_ms', now, 'finished_ms', '', 'error', '', 'meta', ARGV[6],
  'kind', ARGV[8])
if resume ~= '' then redis.call('HSET', KEYS[1], 'checkpoint', resume) end
redis.call('SET', KEYS[3], ARGV[1], 'PX', ttl)
redis.call('SET', KEYS[4], fence, 'PX', ttl)
redis.call('PERSIST', KEYS[2])
add_event(ARGV[3], 'start', ARGV[7], now, ARGV[8])
return {1, fence, attempt, seq, resume, now}
