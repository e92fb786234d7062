--[[ _owner.lua — the lease owner check, prepended (by scripts.py) to the scripts that write as
  the lease holder (beat, finish). Kept apart from _lib.lua so that the beat, which runs most
  often, assembles only what it calls. Keys as in _lib.lua, from KEYS[k + 1] (k: 0 for the
  scripts of one job; 4 * j for the job j of a batch of beats): k + 1 state, k + 3 alive,
  k + 4 fence. The lease is `alive` itself: its value is "<token>:<fence>" of the owner.
]]

--[[ Is (token, fence) still the owner of the job? Renews `alive` (liveness and lease) when it
  is. `fence` is the decimal text the worker sent (a fence can be above 1e14, which Lua's `..`
  of a number would write in exponent form).
  Returns  1  alive holds our token and fence: renewed
           2  alive had expired (or Redis lost it) and nobody claimed the job: re-taken
           3  as 2, and the snapshot is gone too (a restart lost the data): resend static fields
          -1  alive holds another owner's value (taken over)
          -2  the fence moved past ours, or the job already ended (fenced out)
]]
local function owner(token, fence_text, ttl_ms, k)
  local mine = token .. ':' .. fence_text
  local fence = tonumber(fence_text)
  local holder = redis.call('GET', KEYS[k + 3])
  if holder == mine then
    -- Nobody can move the fence while our alive key exists: acquire and claim both require it
    -- to be gone. So the fast path (every beat) skips reading the fence.
    redis.call('PEXPIRE', KEYS[k + 3], ttl_ms)
    return 1
  end
  if holder then return -1 end
  local current = redis.call('GET', KEYS[k + 4])
  if current and tonumber(current) ~= fence then return -2 end
  local status = redis.call('HGET', KEYS[k + 1], 'status')
  if status and status ~= 'RUNNING' then return -2 end
  redis.call('SET', KEYS[k + 3], mine, 'PX', ttl_ms)
  if not current then redis.call('SET', KEYS[k + 4], fence) end
  if status then return 2 end
  return 3
end
