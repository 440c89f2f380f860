"""The engine's load report and /stats round-trip through their wire forms with every field,
``prefix_waits`` (its 16-byte hashes travel as msgpack bytes and as base64 in JSON) and ``decodes`` included."""

from protocol.replica_stats import (
    DecodeProgress,
    PrefixWait,
    ReplicaStats,
    decode_load,
    decode_stats,
    encode_load,
    encode_stats,
)

STATS = ReplicaStats(
    ts=1.5,
    running=2,
    waiting=3,
    queued_prefill_tokens=9_000,
    prefix_waits=[PrefixWait(bytes(range(16)), 6_000, 3)],
    kv_cache_usage=0.25,
    prefill_tokens_per_s=1_000.0,
    decodes=[DecodeProgress(40, 1.25, 216)],
    block_size=16,
    num_blocks=400,
    free_blocks=300,
    cached_free_blocks=10,
    cached_blocks=40,
    num_preemptions=0,
    max_num_seqs=64,
    max_num_batched_tokens=2048,
)


def test_stats_round_trip_through_json() -> None:
    assert decode_stats(encode_stats(STATS)) == STATS


def test_the_load_socket_carries_the_load_part_of_the_stats() -> None:
    load = decode_load(encode_load(STATS.load()))
    assert load == STATS.load()
    assert load.prefix_waits == [PrefixWait(bytes(range(16)), 6_000, 3)]
    assert load.decodes == [DecodeProgress(40, 1.25, 216)]
