--! include: _clock _lib
--[[ cancel.lua — ask the worker of a running job to stop.

  KEYS[1..4] state, events, alive, fence (see _lib.lua)
  ARGV[1] stream MAXLEN   ARGV[2] details JSON or ''

  Sets the snapshot's `cancel` field (the next beat's reply carries it to the worker) and
  records a `cancel` stream entry, in one atomic step.
  Returns 1 requested; 2 already requested; 0 the job is not RUNNING (unknown or ended).
]]
local h = redis.call('HMGET', KEYS[1], 'status', 'cancel')
if h[1] ~= 'RUNNING' then return 0 end
if h[2] == '1' then return 2 end
redis.call('HSET', KEYS[1], 'cancel', '1')
add_event(ARGV[1], 'cancel', ARGV[2], now_ms())
return 1
