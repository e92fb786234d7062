--! include: _clock _lib
--[[ cancel.lua — ask the worker of a running job to stop.

  KEYS[1..4] state, events, alive, fence (see _lib.lua)
  ARGV[1] stream MAXLEN   ARGV[2] details JSON or ''

  Sets the snapshot's `cancel` field and the cancel flag of `alive`'s value (its last field,
  KEEPTTL: the beat's regular path reads it there; the next beat's reply carries it to the
  worker) and records a `cancel` stream entry, in one atomic step. Replay-safe: a second call
  finds the field set and answers 2.
  Returns 1 requested; 2 already requested; 0 the job is not RUNNING (unknown or ended).
]]
local h = redis.call('HMGET', KEYS[1], 'status', 'cancel')
if h[1] ~= 'RUNNING' then return 0 end
if h[2] == '1' then return 2 end
redis.call('HSET', KEYS[1], 'cancel', '1')
local held = redis.call('GET', KEYS[3])
if held and string.sub(held, -2) == ':0' then
  redis.call('SET', KEYS[3], string.sub(held, 1, -2) .. '1', 'KEEPTTL')
end
add_event(ARGV[1], 'cancel', ARGV[2], now_ms())
return 1
