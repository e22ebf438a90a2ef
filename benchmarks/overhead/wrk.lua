-- wrk script of the overhead benchmark (benchmarks/overhead/wrk.py runs it; -t1 only).
--
--   wrk -t1 -c16 -d10s -s wrk.lua URL -- BODIES START
--
-- BODIES is a file of request bodies, one per line (benchmarks/overhead/workloads.py
-- writes it).  Request n (counting from START) sends line n mod #lines, with
--   @@SEQ@@  replaced by n,
--   @@MM@@   by the two-digit minute (n // 7) mod 60,
--   @@GEN@@  by n // #lines as 8 digits (the lines' pass: a new conversation id each pass).
-- workloads.render is the same function in Python; keep the two in step.
-- done() prints one line "WRKJSON {...}" with the counts and latency percentiles (µs).

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

local templates = {}  -- per line: a reusable table of request pieces, and its variable slots
local seq = 0
local KINDS = { SEQ = true, MM = true, GEN = true }

-- The request line and headers up to the Content-Length value (the body's length varies).
local function head()
  local lines = { wrk.method .. " " .. wrk.path .. " HTTP/1.1" }
  local headers = wrk.headers
  if not headers["Host"] then
    headers["Host"] = wrk.host
  end
  for name, value in pairs(headers) do
    if name ~= "Content-Length" then
      lines[#lines + 1] = name .. ": " .. value
    end
  end
  return table.concat(lines, "\r\n") .. "\r\nContent-Length: "
end

-- A line as { pieces = {head, <length>, CRLF CRLF, literal, <value>, literal, ...}, slots = {index, kind}, fixed }:
-- a request fills the slots and concatenates the pieces once (one copy of the body per request).
local function parse(line, request_head)
  local pieces, slots, pos, fixed = { request_head, "", "\r\n\r\n" }, {}, 1, 0
  local literal = {}
  while true do
    local s = string.find(line, "@@", pos, true)
    local kind = s and string.match(line, "^@@(%u+)@@", s)
    if s and KINDS[kind] then
      literal[#literal + 1] = string.sub(line, pos, s - 1)
      pieces[#pieces + 1] = table.concat(literal)
      fixed = fixed + #pieces[#pieces]
      literal = {}
      pieces[#pieces + 1] = ""
      slots[#slots + 1] = { #pieces, kind }
      pos = s + #kind + 4
    elseif s then  -- "@@" that starts no placeholder: text
      literal[#literal + 1] = string.sub(line, pos, s + 1)
      pos = s + 2
    else
      literal[#literal + 1] = string.sub(line, pos)
      pieces[#pieces + 1] = table.concat(literal)
      fixed = fixed + #pieces[#pieces]
      return { pieces = pieces, slots = slots, fixed = fixed }
    end
  end
end

function init(args)
  seq = tonumber(args[2] or "0")
  local request_head = head()
  for line in io.lines(args[1]) do
    if #line > 0 then
      local t = parse(line, request_head)
      if #t.slots == 0 then  -- no placeholder: the same request string every time
        t.pieces[2] = tostring(t.fixed)
        t.request = table.concat(t.pieces)
      end
      templates[#templates + 1] = t
    end
  end
  assert(#templates > 0, "no bodies in " .. args[1])
end

function request()
  local n = seq
  seq = seq + 1
  local t = templates[n % #templates + 1]
  if t.request then
    return t.request
  end
  local pieces, length = t.pieces, t.fixed
  for i = 1, #t.slots do
    local index, kind = t.slots[i][1], t.slots[i][2]
    local value
    if kind == "SEQ" then
      value = tostring(n)
    elseif kind == "MM" then
      value = string.format("%02d", math.floor(n / 7) % 60)
    else
      value = string.format("%08d", math.floor(n / #templates))
    end
    pieces[index] = value
    length = length + #value
  end
  pieces[2] = tostring(length)
  return table.concat(pieces)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,'
      .. '"p50_us":%d,"p90_us":%d,"p99_us":%d,"mean_us":%.1f,"max_us":%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, latency.max
  ))
end
