"""The Lua scripts that count tenant caps in Redis; each runs atomically on the server, on the server's clock.

Keys of one tenant (they share a hash tag, so they would sit in one Redis Cluster hash slot):
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

TAKE_SLOT = (
    _CLOCK
    + _BUCKET
    + _EXPIRE_WITH_LAST_LEASE
    + """
-- KEYS: leases, requests. ARGV: lease id, lease ms, max concurrency, requests per minute (0 = no cap).
-- Returns {0, 0} taken; {1, in flight} over concurrency; {3, wait ms} over requests per minute.
local lease_ms = tonumber(ARGV[2])
local max_concurrency = tonumber(ARGV[3])
local requests_per_minute = tonumber(ARGV[4])

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if max_concurrency > 0 then
  local in_flight = redis.call('ZCARD', KEYS[1])
  if in_flight >= max_concurrency then return {1, in_flight} end
end
if requests_per_minute > 0 then
  local level = bucket_level(KEYS[2], requests_per_minute)
  if level < 1 then return {3, math.ceil((1 - level) * 60000 / requests_per_minute)} end
  bucket_store(KEYS[2], requests_per_minute, level - 1)
end
redis.call('ZADD', KEYS[1], now + lease_ms, ARGV[1])
expire_with_last_lease(KEYS[1])
return {0, 0}
"""
)

FREE_SLOT = """
-- KEYS: the leases set of each lease. ARGV: one lease id per key (one lease, or a batch of them).
-- Returns how many were there (not expired or already freed).
local freed = 0
for index, key in ipairs(KEYS) do
  freed = freed + redis.call('ZREM', key, ARGV[index])
end
return freed
"""

TAKE_TOKENS = (
    _CLOCK
    + _BUCKET
    + """
-- KEYS: tokens. ARGV: tokens, tokens per minute. Returns {0, 0} taken, or {2, wait ms}.
local tokens = tonumber(ARGV[1])
local tokens_per_minute = tonumber(ARGV[2])
local level = bucket_level(KEYS[1], tokens_per_minute)
local needed = math.min(tokens, tokens_per_minute)
if level < needed then return {2, math.ceil((needed - level) * 60000 / tokens_per_minute)} end
bucket_store(KEYS[1], tokens_per_minute, level - tokens)
return {0, 0}
"""
)

GIVE_BACK = (
    _CLOCK
    + _BUCKET
    + """
-- KEYS: tokens. ARGV: unused tokens, tokens per minute. The bucket never exceeds one minute's worth;
-- negative "unused" tokens (used past the grant) are taken unchecked, leaving the bucket in debt.
local tokens_per_minute = tonumber(ARGV[2])
local level = bucket_level(KEYS[1], tokens_per_minute)
bucket_store(KEYS[1], tokens_per_minute, math.min(tokens_per_minute, level + tonumber(ARGV[1])))
return 0
"""
)

RENEW = (
    _CLOCK
    + _EXPIRE_WITH_LAST_LEASE
    + """
-- KEYS: the leases set of each lease. ARGV: lease ms, then one lease id per key.
-- Only leases still present are renewed (XX): one that expired or was freed stays gone.
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
