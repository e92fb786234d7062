--[[ _owner.lua — the lease owner check, prepended (by scripts.py) to the scripts that write as
  the lease holder (beat, finish). Kept apart from _lib.lua so that the beat, which runs most
  often, assembles only what it calls. Keys from KEYS[k + 1] (k: 0 for finish.lua; the job's
  first key for a job of a batch of beats): k + 1 state, k + 4 fence (read only when alive is
  missing). The lease is `alive` itself: its value is "<token>:<fence>:<seq>:<cancel>" (see
  _lib.lua); the caller reads it and writes it.

  The caller reads alive with GETEX (no option: it changes nothing, and costs what GET does).
  GETEX is a write command that is not deny-oom, so it marks the script as one that has
  written: a server at `maxmemory` with `noeviction` refuses a deny-oom command (HSET, SET,
  XADD) only as a flag-less script's first write (Redis 6.2+, Valkey), so the beat and the
  final write still land while Redis is full (docs/reliability.md), as they did when the
  lease's PEXPIRE came first.
]]

--[[ Is (token, fence) still the owner of the job? `fence_text` is the decimal the worker sent
  (a fence can be above 1e14, which Lua's `..` of a number would write in exponent form);
  `held`: alive's value as the caller read it (false: missing). Writes nothing
  but a missing fence counter (re-created on a re-take); the caller renews or re-writes alive.
  Returns  1  alive holds our token and fence
           2  alive had expired (or Redis lost it) and nobody claimed the job: the caller
              re-takes it
           3  as 2, and the snapshot is gone too (a restart lost the data): resend static fields
          -1  alive holds another owner's value (taken over)
          -2  the fence moved past ours, or the job already ended (fenced out)
]]
local function owner(token, fence_text, k, held)
  if held then
    local prefix = token .. ':' .. fence_text .. ':'
    -- Nobody can move the fence while our alive key exists: acquire and claim both require it
    -- to be gone. So an owner that finds its own value skips reading the fence.
    if string.sub(held, 1, #prefix) == prefix then return 1 end
    return -1
  end
  local current = redis.call('GET', KEYS[k + 4])
  if current and tonumber(current) ~= tonumber(fence_text) then return -2 end
  local status = redis.call('HGET', KEYS[k + 1], 'status')
  if status and status ~= 'RUNNING' then return -2 end
  if not current then redis.call('SET', KEYS[k + 4], fence_text) end
  if status then return 2 end
  return 3
end
