"""The Lua scripts that count tenant caps in Redis; each runs atomically on the server, on the server's clock.

Keys of one tenant (they share a hash tag, so one script touches one slot):
- ``leases``: a sorted set of in-flight requests, member = lease id, score = expiry (ms, Redis TIME).
  Expired members are pruned before every count, so a crashed gateway's slots come back by themselves.
- ``tokens`` / ``requests``: hashes ``{level, updated}``, token buckets of one minute's worth that
  refill continuously (the semantics of ``token_bucket.py``; a request larger than the whole
  budget fits a full bucket and leaves it in debt). A missing bucket is a full one, so each
  expires once it would have refilled.
"""

_CLOCK = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""

_BUCKET = """
local function bucket_level(key, cap)
  local state = redis.call('HMGET', key, 'level', 'updated')
  local level = tonumber(state[1])
  if level == nil then return cap end
  local updated = tonumber(state[2]) or now
  return math.min(cap, level + math.max(0, now - updated) * cap / 60000)
end

local function bucket_store(key, cap, level)
  redis.call('HSET', key, 'level', tostring(level), 'updated', now)
  redis.call('PEXPIRE', key, math.ceil((cap - level) * 60000 / cap) + 1000)
end
"""

_EXPIRE_WITH_LAST_LEASE = """
local function expire_with_last_lease(key)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then redis.call('PEXPIREAT', key, math.floor(tonumber(last[2])) + 1000) end
end
"""

ADMIT = (
    _CLOCK
    + _BUCKET
    + _EXPIRE_WITH_LAST_LEASE
    + """
-- KEYS: leases, tokens, requests. ARGV: lease id, lease ms, max concurrency, tokens,
-- tokens per minute, requests per minute (0 = no cap).
-- Returns {0, 0} admitted; {1, in flight} over concurrency; {2, wait ms} over tokens; {3, wait ms} over requests.
local lease_ms = tonumber(ARGV[2])
local max_concurrency = tonumber(ARGV[3])
local tokens = tonumber(ARGV[4])
local tokens_per_minute = tonumber(ARGV[5])
local requests_per_minute = tonumber(ARGV[6])

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if max_concurrency > 0 then
  local in_flight = redis.call('ZCARD', KEYS[1])
  if in_flight >= max_concurrency then return {1, in_flight} end
end
local token_level = 0
if tokens_per_minute > 0 then
  token_level = bucket_level(KEYS[2], tokens_per_minute)
  local needed = math.min(tokens, tokens_per_minute)
  if token_level < needed then
    return {2, math.ceil((needed - token_level) * 60000 / tokens_per_minute)}
  end
end
local request_level = 0
if requests_per_minute > 0 then
  request_level = bucket_level(KEYS[3], requests_per_minute)
  if request_level < 1 then return {3, math.ceil((1 - request_level) * 60000 / requests_per_minute)} end
end
if tokens_per_minute > 0 then bucket_store(KEYS[2], tokens_per_minute, token_level - tokens) end
if requests_per_minute > 0 then bucket_store(KEYS[3], requests_per_minute, request_level - 1) end
redis.call('ZADD', KEYS[1], now + lease_ms, ARGV[1])
expire_with_last_lease(KEYS[1])
return {0, 0}
"""
)

SETTLE = (
    _CLOCK
    + _BUCKET
    + """
-- KEYS: leases, tokens. ARGV: lease id, unused tokens, tokens per minute (0 = no cap).
-- Unused tokens go back only while the lease exists (an expired or unknown lease took nothing
-- this call can vouch for). Returns 1 when the lease was there.
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
local unused = tonumber(ARGV[2])
local tokens_per_minute = tonumber(ARGV[3])
if removed == 1 and unused > 0 and tokens_per_minute > 0 then
  local level = bucket_level(KEYS[2], tokens_per_minute)
  bucket_store(KEYS[2], tokens_per_minute, math.min(tokens_per_minute, level + unused))
end
return removed
"""
)

RENEW = (
    _CLOCK
    + _EXPIRE_WITH_LAST_LEASE
    + """
-- KEYS: the leases set of each lease. ARGV: lease ms, then one lease id per key.
-- Only leases still present are renewed (XX): one that expired or was settled stays gone.
local lease_ms = tonumber(ARGV[1])
local renewed = 0
for index, key in ipairs(KEYS) do
  renewed = renewed + redis.call('ZADD', key, 'XX', 'CH', now + lease_ms, ARGV[index + 1])
  expire_with_last_lease(key)
end
return renewed
"""
)

IN_FLIGHT = (
    _CLOCK
    + """
-- KEYS: leases. The live leases of a tenant across every gateway (expired ones pruned).
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
"""
)
