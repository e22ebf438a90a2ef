"""The Lua scripts of the Redis store, one per step, each on the keys of one hash slot.

A conversation's *home* is one HASH (``pp:{HOME}:<tenant>:h``).  Its fields::

    #               entries held (links, records, blobs, response ids)
    +               bytes of the blobs held
    !               the home's write sequence: each record bumps it, and every field it
                    writes carries it (the home's own oldest-first order, no clock)
    =               what the tenant's index was last told: "entries,bytes,time"
    l<link>         "<seq>,<id>,<id>,...": the lineages owning this link, newest first
    g<id>           "<seq>:<kind>:<skeleton>:<system ref>:<tools ref>|<record JSON>": a
                    lineage record, with what LOOKUP needs of it to choose blobs
    s<ref>          "<seq>,<size>": a blob is held (its bytes under b<ref>)
    b<ref>          a system / tools[] blob
    r<response id>  "<seq>": a response id this home answers (its key is elsewhere)

One HASH per conversation: a lookup is one HMGET of its newest links (and one of
their records), a record one HMGET and one HSET, and the whole conversation
expires, is evicted by ``maxmemory``, or survives, together.

The tenant's tenant-wide HASH (``pp:{T}:<tenant>:w``, in the slot of its index) holds
what learning keeps for all its conversations (WIDE).

The tenant's index (``pp:{T}:<tenant>:t``, a ZSET of homes by the time they last
reported, and ``:c``, a HASH of what each holds and the total under ``''``) holds
the tenant to ``store.tenant_max_entries`` and ``tenant_max_bytes`` across shards:
a home reports when it outgrew what it reserved, when its bytes changed, or a while
after its last report, and the index drops the tenant's least recently reporting
homes first.
"""

from __future__ import annotations

# KEYS: the home.  ARGV: declared id or '', max candidates, links to scan past the
# deepest, the request's skeleton and tools[] ref as sent ('' '': no blobs wanted), max
# blobs, then the fields of the request's newest links ('l' .. link), oldest first.
# Returns {depth, declared record or '', n blobs, ref1, blob1, ..., depth1, record1,
# depth2, record2, ...}; the records still carry their "<seq>:<hints>|" prefix.  The
# blobs: the system and tools[] of the lineages found (the declared one first) that are
# forks or whose skeleton or tools[] differ from the request's, what a fork, a fork's
# later turn or learning reads next (records written without hints have none).
LOOKUP = """#!lua flags=no-writes
local home = KEYS[1]
local declared, max_c, scan_up = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local want_sk, want_tr, max_b = ARGV[4], ARGV[5], tonumber(ARGV[6])
local at = 6
local n = #ARGV - at
local owners = {}
local function fetch(lo, hi, extra)
  local fields = extra
  local base = #fields
  for i = lo, hi do fields[base + 1 + i - lo] = ARGV[at + i] end
  local got = redis.call('HMGET', home, unpack(fields))
  for i = lo, hi do owners[i] = got[base + 1 + i - lo] end
  return got
end
local refs, seen_ref = {}, {}
local function consider(rec)
  if want_tr == '' or #refs >= max_b then return end
  local k, sk, sr, tr = string.match(rec, '^%d+:(%a):([^:]*):([^:]*):([^|]*)|')
  if k and (k == 'f' or sk ~= want_sk or tr ~= want_tr) then
    for _, r in ipairs({sr, tr}) do
      if r ~= '' and not seen_ref[r] and #refs < max_b then
        seen_ref[r] = true
        refs[#refs + 1] = r
      end
    end
  end
end
local function finish(depth, found, cands)
  local out = {depth, found or ''}
  if found then consider(found) end
  for i = 2, #cands, 2 do consider(cands[i]) end
  local blobs = {}
  if #refs > 0 then
    local fields = {}
    for i, r in ipairs(refs) do fields[i] = 'b' .. r end
    local got = redis.call('HMGET', home, unpack(fields))
    for i, r in ipairs(refs) do
      if got[i] then
        blobs[#blobs + 1] = r
        blobs[#blobs + 1] = got[i]
      end
    end
  end
  out[3] = #blobs / 2
  for _, v in ipairs(blobs) do out[#out + 1] = v end
  for _, v in ipairs(cands) do out[#out + 1] = v end
  return out
end
local first = math.max(1, n - scan_up - 2)
local extra = {'#'}
if declared ~= '' then extra[2] = 'g' .. declared end
local got = fetch(first, n, extra)
if not got[1] then return {0, '', 0} end
local found = nil
if declared ~= '' and got[2] then found = got[2] end
local depth = 0
for i = n, first, -1 do
  if owners[i] then depth = i break end
end
if depth == 0 and first > 1 then
  fetch(1, first - 1, {})
  for i = first - 1, 1, -1 do
    if owners[i] then depth = i break end
  end
elseif depth > 0 and depth - scan_up < first and first > 1 then
  fetch(math.max(1, depth - scan_up), first - 1, {})
end
if depth == 0 then return finish(0, found, {}) end
local ids, depths, seen = {}, {}, {}
for i = depth, math.max(1, depth - scan_up), -1 do
  local v = owners[i]
  if v then
    local skip = true
    for id in string.gmatch(v, '[^,]+') do
      if skip then skip = false
      elseif not seen[id] then
        seen[id] = true
        ids[#ids + 1] = 'g' .. id
        depths[#ids] = i
        if #ids >= max_c then break end
      end
    end
  end
  if #ids >= max_c then break end
end
local cands = {}
if #ids > 0 then
  local recs = redis.call('HMGET', home, unpack(ids))
  for i = 1, #ids do
    if recs[i] then
      cands[#cands + 1] = depths[i]
      cands[#cands + 1] = recs[i]
    end
  end
end
return finish(depth, found, cands)
"""

# KEYS: the home.  ARGV: id, record JSON, ttl, owners per link, max entries, max
# bytes, report every (s), now (s), n links, n blobs, n touched, a Responses API
# response id this home now answers ('' if none: MARK, in the same write), the
# record's hints ("<r|f>:<skeleton>:<system ref>:<tools ref>", which LOOKUP reads
# without parsing the JSON), then the links' fields ('l' .. link), the new blobs'
# refs, their bytes, the touched refs.
# Returns {report entries (-1: no report due), entries, bytes, n missing, missing
# refs..., dropped response ids...}.
RECORD = """
local home = KEYS[1]
local id, rec = ARGV[1], ARGV[2]
local ttl, cap, max_e, max_b = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local every, now = tonumber(ARGV[7]), tonumber(ARGV[8])
local nl, nb, nt, rid = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]), ARGV[12]
local hints = ARGV[13]
local at_links, at_refs = 13, 13 + nl
local at_raw, at_touch = at_refs + nb, at_refs + 2 * nb
local fields = {'#', '+', '!', '=', 'g' .. id}
for i = 1, nl do fields[5 + i] = ARGV[at_links + i] end
for i = 1, nb do fields[#fields + 1] = 's' .. ARGV[at_refs + i] end
for i = 1, nt do fields[#fields + 1] = 's' .. ARGV[at_touch + i] end
if rid ~= '' then fields[#fields + 1] = 'r' .. rid end
local got = redis.call('HMGET', home, unpack(fields))
local count, bytes = tonumber(got[1] or '0'), tonumber(got[2] or '0')
local seq = tonumber(got[3] or '0') + 1
local set = {}
local function put(f, v)
  set[#set + 1] = f
  set[#set + 1] = v
end
if not got[5] then count = count + 1 end
put('g' .. id, seq .. ':' .. hints .. '|' .. rec)
local k = 5
for i = 1, nl do
  local v = got[k + i]
  local owners = {seq, id}
  if v then
    local skip = true
    for o in string.gmatch(v, '[^,]+') do
      if skip then skip = false
      elseif o ~= id and #owners <= cap then owners[#owners + 1] = o end
    end
  else
    count = count + 1
  end
  put(ARGV[at_links + i], table.concat(owners, ','))
end
k = k + nl
for i = 1, nb do
  local ref, meta = ARGV[at_refs + i], got[k + i]
  if meta then
    put('s' .. ref, seq .. string.match(meta, ',%d+$'))
  else
    local raw = ARGV[at_raw + i]
    put('s' .. ref, seq .. ',' .. #raw)
    put('b' .. ref, raw)
    count, bytes = count + 1, bytes + #raw
  end
end
k = k + nb
local missing = {}
for i = 1, nt do
  local ref, meta = ARGV[at_touch + i], got[k + i]
  if meta then
    put('s' .. ref, seq .. string.match(meta, ',%d+$'))
  else
    missing[#missing + 1] = ref
  end
end
if rid ~= '' and not got[k + nt + 1] then
  put('r' .. rid, seq)
  count = count + 1
end

-- Over the tenant's bounds on its own (one long conversation): its oldest fields go,
-- down to 3/4 of the bounds, never those this record writes.
local dropped = {}
if count > max_e or bytes > max_b then
  local writing = {}
  for i = 1, #set, 2 do writing[set[i]] = true end
  local names = {}
  for _, f in ipairs(redis.call('HKEYS', home)) do
    local c = string.sub(f, 1, 1)
    if (c == 'l' or c == 'g' or c == 's' or c == 'r') and not writing[f] then names[#names + 1] = f end
  end
  local aged = {}
  for lo = 1, #names, 4000 do
    local part = {}
    for i = lo, math.min(lo + 3999, #names) do part[#part + 1] = names[i] end
    local vals = redis.call('HMGET', home, unpack(part))
    for i, f in ipairs(part) do
      if vals[i] then aged[#aged + 1] = {tonumber(string.match(vals[i], '^%d+')), f, vals[i]} end
    end
  end
  table.sort(aged, function(a, b) return a[1] < b[1] end)
  local gone = {}
  for _, item in ipairs(aged) do
    if count <= max_e * 3 / 4 and bytes <= max_b * 3 / 4 then break end
    local f = item[2]
    local c = string.sub(f, 1, 1)
    gone[#gone + 1] = f
    count = count - 1
    if c == 's' then
      gone[#gone + 1] = 'b' .. string.sub(f, 2)
      bytes = bytes - tonumber(string.match(item[3], ',(%d+)$'))
    elseif c == 'r' then
      dropped[#dropped + 1] = string.sub(f, 2)
    end
  end
  for lo = 1, #gone, 4000 do
    redis.call('HDEL', home, unpack(gone, lo, math.min(lo + 3999, #gone)))
  end
end

put('#', count)
put('+', bytes)
put('!', seq)
local report = -1
local r_e, r_b, r_t = string.match(got[4] or '', '^(%d+),(%d+),(%d+)$')
if not r_e or count > tonumber(r_e) or bytes ~= tonumber(r_b) or now - tonumber(r_t) >= every then
  report = count + math.min(count, 16)
  put('=', report .. ',' .. bytes .. ',' .. now)
end
redis.call('HSET', home, unpack(set))
redis.call('EXPIRE', home, ttl)
local out = {report, count, bytes, #missing}
for _, ref in ipairs(missing) do out[#out + 1] = ref end
for _, rid in ipairs(dropped) do out[#out + 1] = rid end
return out
"""

# KEYS: the home.  ARGV: response id, ttl.  A response id this home answers: counted
# as one of its entries (its key, in the response id's own slot, is written beside);
# (RECORD marks it itself when the record carries the response.)
MARK = """
local home = KEYS[1]
if redis.call('HSETNX', home, 'r' .. ARGV[1], redis.call('HGET', home, '!') or '0') == 1 then
  redis.call('HINCRBY', home, '#', 1)
  redis.call('EXPIRE', home, tonumber(ARGV[2]))
end
return 1
"""

# KEYS: the tenant's index (ZSET), its counts (HASH).  ARGV: home, entries, bytes, now,
# max entries, max bytes, ttl.  Returns the homes to drop (the tenant's least
# recently reporting first, never the one reporting).
REPORT = """
local index, counts = KEYS[1], KEYS[2]
local home, e, b, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local max_e, max_b, ttl = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local got = redis.call('HMGET', counts, '', home)
local te, tb = string.match(got[1] or '0,0', '^(-?%d+),(-?%d+)$')
te, tb = tonumber(te), tonumber(tb)
if got[2] then
  local oe, ob = string.match(got[2], '^(%d+),(%d+)$')
  te, tb = te - tonumber(oe), tb - tonumber(ob)
end
te, tb = te + e, tb + b
redis.call('ZADD', index, now, home)
local dropped = {}
while te > max_e or tb > max_b do
  local batch = redis.call('ZRANGE', index, 0, 63)
  if #batch == 0 then break end
  local victims = {}
  for _, h in ipairs(batch) do
    if h ~= home then victims[#victims + 1] = h end
  end
  if #victims == 0 then break end
  local sizes = redis.call('HMGET', counts, unpack(victims))
  local chosen = {}
  for i, h in ipairs(victims) do
    if te <= max_e and tb <= max_b then break end
    local ve, vb = string.match(sizes[i] or '0,0', '^(%d+),(%d+)$')
    te, tb = te - tonumber(ve), tb - tonumber(vb)
    chosen[#chosen + 1] = h
    dropped[#dropped + 1] = h
  end
  redis.call('ZREM', index, unpack(chosen))
  redis.call('HDEL', counts, unpack(chosen))
end
redis.call('HSET', counts, home, e .. ',' .. b, '', te .. ',' .. tb)
redis.call('EXPIRE', index, ttl)
redis.call('EXPIRE', counts, ttl)
return dropped
"""

# KEYS: a home the tenant's index dropped.  Returns the response ids it answered
# (their keys live in other slots).
DROP = """
local rids = {}
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(f, 1, 1) == 'r' then rids[#rids + 1] = string.sub(f, 2) end
end
redis.call('DEL', KEYS[1])
return rids
"""

# KEYS: the tenant's tenant-wide HASH.  ARGV: ttl, markers per link, max fields, the
# lineage's id, its first message's ref, n marks, n blobs, then the marked links, the
# evidence refs, their bytes.  Fields: '#' fields held, '!' the write sequence,
# 'm' .. link "<seq>,<id> <first>,..." (newest first), 'e' .. ref "<seq>|<bytes>" (the
# first bytes written are kept).  Over max fields, its oldest go, down to 3/4.
WIDE = """
local key = KEYS[1]
local ttl, cap, max_f = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local id, first = ARGV[4], ARGV[5]
local nm, nb = tonumber(ARGV[6]), tonumber(ARGV[7])
local at_marks, at_refs = 7, 7 + nm
local at_raw = at_refs + nb
local fields = {'#', '!'}
for i = 1, nm do fields[2 + i] = 'm' .. ARGV[at_marks + i] end
for i = 1, nb do fields[2 + nm + i] = 'e' .. ARGV[at_refs + i] end
local got = redis.call('HMGET', key, unpack(fields))
local count, seq = tonumber(got[1] or '0'), tonumber(got[2] or '0') + 1
local set = {}
local mine = id .. ' '
for i = 1, nm do
  local v = got[2 + i]
  local markers = {seq, mine .. first}
  if v then
    local skip = true
    for m in string.gmatch(v, '[^,]+') do
      if skip then skip = false
      elseif #markers <= cap and string.sub(m, 1, #mine) ~= mine then markers[#markers + 1] = m end
    end
  else
    count = count + 1
  end
  set[#set + 1] = fields[2 + i]
  set[#set + 1] = table.concat(markers, ',')
end
for i = 1, nb do
  if not got[2 + nm + i] then
    set[#set + 1] = fields[2 + nm + i]
    set[#set + 1] = seq .. '|' .. ARGV[at_raw + i]
    count = count + 1
  end
end
if count > max_f then
  local writing = {}
  for i = 1, #set, 2 do writing[set[i]] = true end
  local names = {}
  for _, f in ipairs(redis.call('HKEYS', key)) do
    if f ~= '#' and f ~= '!' and not writing[f] then names[#names + 1] = f end
  end
  local aged = {}
  for lo = 1, #names, 4000 do
    local part = {}
    for i = lo, math.min(lo + 3999, #names) do part[#part + 1] = names[i] end
    local vals = redis.call('HMGET', key, unpack(part))
    for i, f in ipairs(part) do
      if vals[i] then aged[#aged + 1] = {tonumber(string.match(vals[i], '^%d+')) or 0, f} end
    end
  end
  table.sort(aged, function(a, b) return a[1] < b[1] end)
  local gone = {}
  for _, item in ipairs(aged) do
    if count <= max_f * 3 / 4 then break end
    gone[#gone + 1] = item[2]
    count = count - 1
  end
  for lo = 1, #gone, 4000 do
    redis.call('HDEL', key, unpack(gone, lo, math.min(lo + 3999, #gone)))
  end
end
set[#set + 1] = '#'
set[#set + 1] = count
set[#set + 1] = '!'
set[#set + 1] = seq
redis.call('HSET', key, unpack(set))
redis.call('EXPIRE', key, ttl)
return count
"""
