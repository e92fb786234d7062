--[[ _clock.lua — the server clock, read ONCE, as the script's first step (before any write).

  Prepended (by scripts.py) to every script that reads the time; scripts call now_ms() (and
  next_fence, now_us()) and never TIME themselves. Reading first means a server that refuses
  TIME in scripts fails the call before it wrote anything, so the client may switch to the
  argument variant (_clock_arg.lua) and send the same call again.
]]
local CLOCK = redis.call('TIME')

local function now_ms()
  return tonumber(CLOCK[1]) * 1000 + math.floor(tonumber(CLOCK[2]) / 1000)
end

local function now_us()
  return tonumber(CLOCK[1]) * 1000000 + tonumber(CLOCK[2])
end
