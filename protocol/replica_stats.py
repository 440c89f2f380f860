"""What a replica says about itself: its load (pushed many times a second) and its stats (GET /stats).

The bundled engine writes these structs and the gateway reads them typed, so the two sides agree
on every field by construction. ``ReplicaLoad`` is the lean part that routing needs (the engine
publishes it as msgpack on its load socket); ``ReplicaStats`` adds the cache's size and shape
(JSON at GET /stats), flat: a ``ReplicaStats`` is a ``ReplicaLoad``. vLLM backends give the gateway a ``ReplicaLoad`` built from their /metrics.
"""

import msgspec


class PrefixWait(msgspec.Struct, frozen=True, array_like=True):
    """Waiting prompts held behind one prefix block a running request is computing."""

    block_hash: bytes
    """The awaited block (kvgate's hash, 16 bytes, from the root)."""
    tokens: int
    """Their prompt tokens still to compute, counted in ``queued_prefill_tokens``."""
    requests: int
    """How many prompts wait for it."""


class DecodeProgress(msgspec.Struct, frozen=True, array_like=True):
    """How far one request's decode has come: what a router needs to tell whether a stall of so
    many seconds pushes its mean inter-token latency past a target (gateway/routing/decode_slack.py)."""

    tokens: int
    """Output tokens so far; 0 before its first token (queued, or its prompt being prefilled)."""
    decode_s: float
    """Seconds from its first token to its latest."""
    tokens_left: int
    """At most this many more: ``max_tokens`` or the context left, whichever ends it first."""


class ReplicaLoad(msgspec.Struct, frozen=True, kw_only=True):
    """The work a replica has now, counted over every gateway that sends it requests."""

    ts: float
    """Wall-clock time (``time.time()``) the replica took the reading."""
    running: int
    """Requests in the running batch (prefilling or decoding)."""
    waiting: int
    """Requests queued for admission, preempted ones included, and (bundled engine) those that
    reached it during a step and wait in its command queue (``engine/core/load_reading.py``)."""
    queued_prefill_tokens: int | None = None
    """Prompt tokens received but not yet computed, over running and waiting requests; None when
    the replica cannot tell (vLLM's metrics have no such gauge)."""
    prefix_waits: list[PrefixWait] = []
    """The part of ``queued_prefill_tokens`` waiting for a prefix being computed, by the awaited
    block: a request that shares none of those blocks is admitted ahead of them. Bundled engine only."""
    kv_cache_usage: float | None = None
    """Fraction of KV blocks held by requests (0 to 1)."""
    prefill_tokens_per_s: float | None = None
    """Measured prefill rate (a moving average); None before the first prefill."""
    started_at: float | None = None
    """Wall-clock time the replica's process started; None where it does not say. A later value
    than any seen before is a restarted replica, whose KV cache is empty."""
    pending_prefixes: list[list[bytes]] = []
    """Block hashes (kvgate's, 16 bytes, from the root) of the full prompt blocks of each request
    queued since the previous message: blocks the replica is about to cache. Every gateway holds
    them as soon to be cached there, so gateways that route the same new prefix at once agree on
    the replica before its KV events exist. Load socket of the bundled engine only."""
    decodes: list[DecodeProgress] | None = None
    """Each request, running or queued, with an inter-token interval still to come; None where the
    replica cannot tell (vLLM's metrics have no such thing). Bundled engine only."""
    arrivals: dict[str, int] | None = None
    """By sender (a gateway view's origin), the latest of its requests this reading counts, or that
    has ended here (``protocol/load_mark.py``); None where the replica does not say (vLLM), and the
    sender then guesses by time. Bundled engine only."""


class ReplicaStats(ReplicaLoad, frozen=True, kw_only=True):
    """The bundled engine's GET /stats: its load plus its KV cache's size and configuration."""

    block_size: int
    num_blocks: int
    free_blocks: int
    """Blocks an allocation may take (empty plus cached-free)."""
    cached_free_blocks: int
    cached_blocks: int
    """Blocks a prompt can hit, in use or not."""
    num_preemptions: int
    max_num_seqs: int
    max_num_batched_tokens: int
    host_blocks: int = 0
    """Slots of the host KV tier (0: none)."""
    host_cached_blocks: int = 0
    host_kv_cache_usage: float = 0.0
    host_hit_blocks: int = 0
    """Blocks copied back from the host tier instead of recomputed, since start."""
    retained_free_blocks: int = 0
    """Cached-free blocks held for active sessions' latest turns."""

    def load(self) -> ReplicaLoad:
        """The lean part, as the load socket publishes it."""
        return ReplicaLoad(
            ts=self.ts,
            running=self.running,
            waiting=self.waiting,
            queued_prefill_tokens=self.queued_prefill_tokens,
            prefix_waits=self.prefix_waits,
            kv_cache_usage=self.kv_cache_usage,
            prefill_tokens_per_s=self.prefill_tokens_per_s,
            started_at=self.started_at,
            pending_prefixes=self.pending_prefixes,
            decodes=self.decodes,
            arrivals=self.arrivals,
        )


_load_encoder = msgspec.msgpack.Encoder()
_load_decoder = msgspec.msgpack.Decoder(ReplicaLoad)
_stats_decoder = msgspec.json.Decoder(ReplicaStats)


def encode_load(load: ReplicaLoad) -> bytes:
    """One load message (msgpack), as the engine's load socket sends it."""
    return _load_encoder.encode(load)


def decode_load(payload: bytes) -> ReplicaLoad:
    """Raises ``msgspec.DecodeError`` (a ``ValueError``) for anything but a load message."""
    return _load_decoder.decode(payload)


def encode_stats(stats: ReplicaStats) -> bytes:
    return msgspec.json.encode(stats)


def decode_stats(body: bytes) -> ReplicaStats:
    """Raises ``msgspec.DecodeError`` (a ``ValueError``) for anything but the engine's /stats."""
    return _stats_decoder.decode(body)
