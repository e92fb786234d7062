--[[ _clock_arg.lua — the argument variant of _clock.lua, for servers that refuse TIME in
  scripts: the time (server ms, as the client estimates it: see docs/compatibility.md) is the
  call's LAST argument, appended by the client (ScriptClock.stamp). The script sees ARGV
  without it, so its ARGV numbering (and every `#ARGV` loop) is that of the default variant.
]]
local CLOCK_MS = tonumber(ARGV[#ARGV])
local ARGV = (function(all)
  local rest = {}
  for i = 1, #all - 1 do rest[i] = all[i] end
  return rest
end)(ARGV)

local function now_ms()
  return CLOCK_MS
end

local function now_us()
  return CLOCK_MS * 1000
end
