"""The router's cache model (predicted and precise), calibration, hot reload and stats."""

import asyncio
import time

import zmq

from gateway.routing.cache_tracker import CacheTracker, ReplicaIndexStats
from gateway.routing.calibration import CalibrationStats
from gateway.routing.config import RoutingConfig
from gateway.routing.router import ReplicaSpec, Router
from radix.hashing import hash_to_bytes
from radix.kv_event_format import BlockStored, EventBatch, frames
from radix.kv_event_ingest import KVEventApplier
from tests.procs import free_port
from tests.routing.helpers import BLOCK, MODEL, request, router, state, warm

IDLE = [state("a"), state("b"), state("c")]


def test_predicted_mode_models_each_replicas_lru_capacity() -> None:
    r = Router(RoutingConfig(), BLOCK, [ReplicaSpec("a", MODEL, None, 128), ReplicaSpec("b", MODEL, None, None)])
    for prefix in range(3):
        warm(r, "a", prefix)
    assert r.tracker.index.blocks("a") <= 128
    assert r.route(request(0), [state("a"), state("b")]).decision.reason == "no-match", "prefix 0 was evicted from a"
    assert r.route(request(2), [state("a"), state("b")]).decision.predicted_cached_tokens == 960
    unsized = [ReplicaSpec("a", MODEL, None, None), ReplicaSpec("b", MODEL, None, None)]
    r.update(RoutingConfig(default_capacity_blocks=64), unsized)
    assert r.tracker.index.blocks("a") <= 64 and r.tracker.index.blocks("b") == 0


def test_calibration_compares_prediction_with_reported_cached_tokens() -> None:
    r = router()
    warm(r, "a", prefix=1)
    first, second = request(1, request_id="x"), request(1, request_id="y")
    for req, reported in ((first, 960), (second, 640)):
        ticket = r.route(req, IDLE)
        r.on_routed(ticket, ticket.decision.backend)
        r.on_finished(ticket, reported, prefilled=True)
    assert r.stats().calibration == CalibrationStats(
        count=2, exact_fraction=0.5, mean_abs_error_tokens=160.0, mean_error_tokens=160.0
    )


def test_a_failed_request_takes_back_only_the_blocks_it_added() -> None:
    r = router()
    warm(r, "a", prefix=1)
    longer = request(1, prompt_tokens=2048, request_id="long")
    ticket = r.route(longer, IDLE)
    r.on_routed(ticket, ticket.decision.backend)
    assert r.tracker.index.match(longer.block_hashes) == {"a": 128}
    r.on_finished(ticket, None, prefilled=False)
    assert r.tracker.index.match(longer.block_hashes) == {"a": 60}


def test_hot_reload_changes_policy_and_replicas() -> None:
    r = router()
    warm(r, "a", prefix=1)
    warm(r, "b", prefix=2)
    specs = [ReplicaSpec(name, MODEL, None, None) for name in ("b", "c", "d")]
    r.update(RoutingConfig(policy="round_robin"), specs)
    assert r.stats().policy == "round_robin"
    assert set(r.stats().index.per_replica) == {"b", "c", "d"}
    assert r.tracker.index.match(request(1).block_hashes) == {}, "a's blocks left with a"
    assert r.tracker.index.match(request(2).block_hashes) == {"b": 60}
    assert r.route(request(2), [state("b"), state("c"), state("d")]).decision.reason == "round-robin"


def test_stats_report_index_size() -> None:
    r = router()
    warm(r, "a", prefix=1)
    index = r.stats().index
    assert index.blocks == 64
    assert index.per_replica["a"] == ReplicaIndexStats(mode="predicted", blocks=64, speculative_blocks=0)
    assert 64 * 100 < index.approx_bytes < 64 * 300


def test_a_restart_empties_a_predicted_replica_and_leaves_a_precise_one_to_its_events() -> None:
    """A precise replica's KV-event subscriber clears it when the publisher restarts and refills it
    from the new process's events, which may come before the health check sees the new start
    time: only predicted replicas are cleared on a restart."""
    specs = [ReplicaSpec("a", MODEL, None, None), ReplicaSpec("b", MODEL, "tcp://127.0.0.1:1", None)]
    tracker = CacheTracker(RoutingConfig(), BLOCK, specs)
    hashes = request(1).block_hashes
    tracker.record_routed(hashes, "a")
    tracker.index.insert("b", hashes, now=0.0)
    tracker.record_restart("a")
    tracker.record_restart("b")
    assert tracker.match(hashes) == {"b": 64}


def test_precise_mode_speculative_entries_expire() -> None:
    now = [100.0]
    specs = [ReplicaSpec("a", MODEL, "tcp://127.0.0.1:1", None), ReplicaSpec("b", MODEL, "tcp://127.0.0.1:2", None)]
    tracker = CacheTracker(RoutingConfig(speculative_ttl_s=2.0), BLOCK, specs, clock=lambda: now[0])
    hashes = request(1).block_hashes
    tracker.record_routed(hashes, "a")
    assert tracker.match(hashes) == {"a": 64} and len(tracker.index) == 0
    now[0] += 1.5
    assert tracker.match(hashes) == {"a": 64}
    now[0] += 1.0
    assert tracker.match(hashes) == {}


def test_a_prefill_stored_in_chunks_still_matches_whole_while_the_rest_is_computed() -> None:
    """The engine's events for a prompt's first chunk settle those blocks (their speculative entries
    go); the blocks still being computed stay speculative and continue the stored part, so a
    request arriving mid-prefill sees the whole prefix on that replica, not the first chunk."""
    specs = [ReplicaSpec("a", MODEL, "tcp://127.0.0.1:1", None), ReplicaSpec("b", MODEL, "tcp://127.0.0.1:2", None)]
    tracker = CacheTracker(RoutingConfig(), BLOCK, specs, clock=lambda: 100.0)
    routed = request(1)
    tracker.record_routed(routed.block_hashes, "a")
    applier = KVEventApplier(tracker.index, "a", MODEL, BLOCK, tracker.speculative, clock=lambda: 100.0)
    first_chunk = BlockStored(
        [hash_to_bytes(h) for h in routed.block_hashes[:16]], None, routed.token_ids[: 16 * BLOCK], BLOCK
    )
    applier.apply(EventBatch(100.0, [first_chunk]))
    assert tracker.index.blocks("a") == 16
    assert tracker.match(routed.block_hashes) == {"a": 64}
    follow_up = request(1, request_id="follow-up")
    assert tracker.match(follow_up.block_hashes) == {"a": 960 // BLOCK}, "the shared 960 tokens, past the stored chunk"
    tracker.record_failed(routed.block_hashes, "a", 16)
    assert tracker.match(routed.block_hashes) == {"a": 16}, "a request that fails leaves only what was stored"


async def test_precise_mode_routes_on_published_kv_events() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    publisher = zmq.Context.instance().socket(zmq.PUB)
    publisher.setsockopt(zmq.LINGER, 0)
    publisher.bind(endpoint)
    r = Router(RoutingConfig(), BLOCK, [ReplicaSpec("a", MODEL, None, None), ReplicaSpec("b", MODEL, endpoint, None)])
    await r.start()
    try:
        req = request(3, prompt_tokens=1000)
        stored = BlockStored([hash_to_bytes(h) for h in req.block_hashes[:50]], None, req.token_ids[:800], BLOCK)
        deadline = time.monotonic() + 10
        sequence = 0
        while r.tracker.index.blocks("b") == 0:
            assert time.monotonic() < deadline
            publisher.send_multipart(frames("kv-events", sequence, EventBatch(0.0, [stored])))
            sequence += 1
            await asyncio.sleep(0.02)
        decision = r.route(req, [state("a"), state("b")]).decision
        assert (decision.backend, decision.reason, decision.predicted_cached_tokens) == ("b", "prefix-hit", 800)
        assert r.stats().index.per_replica["b"].mode == "precise"
    finally:
        await r.stop()
        publisher.close()
