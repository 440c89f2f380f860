"""The model of Dynamo's KV router: its cost per worker, its reservations, its tie-break."""

import pytest

from bench.peers.dynamo_config import DynamoConfig
from bench.sim.dynamo_model import DynamoKVRouter
from bench.sim.peer_kv_index import PeerKVIndex
from bench.sim.peer_models import DYNAMO_MODELLED
from bench.sim.simulate import SimFleet, VirtualFleet
from tests.bench.test_simulate import COSTS, REQUESTS

BLOCK = 16


def chain(prefix: int, blocks: int) -> list[int]:
    return [prefix * 1000 + position for position in range(blocks)]


def router(seed: int = 0, **knobs: float) -> DynamoKVRouter:
    return DynamoKVRouter(["a", "b"], BLOCK, PeerKVIndex(["a", "b"]), seed, DynamoConfig(**knobs))


def test_cost_is_uncached_prefill_blocks_plus_potential_decode_blocks() -> None:
    model = router()
    model.index.add("a", chain(1, 4))
    prompt = chain(1, 8)
    # a: max((0 + 128) / 16 - 4 overlap, 0) + 8 request blocks; b: 8 + 8.
    assert model.costs(prompt, 8 * BLOCK) == {"a": 12.0, "b": 16.0}
    assert model.route("r1", prompt, 8 * BLOCK) == ("a", "kv-cost")


def test_overlap_counts_only_the_run_from_block_zero() -> None:
    model = router()
    model.index.add("a", chain(1, 8)[1:])
    assert model.costs(chain(1, 8), 8 * BLOCK)["a"] == 16.0, "without block 0 nothing is credited"


def test_a_routed_request_is_prefill_load_until_its_first_token_and_active_blocks_until_freed() -> None:
    model = router()
    model.index.add("a", chain(1, 4))
    prompt = chain(1, 8)
    model.route("r1", prompt, 8 * BLOCK)
    # a: (64 queued uncached + 128) / 16 - 4 = 8, plus 8 active blocks the prompt shares: 16.
    assert model.costs(prompt, 8 * BLOCK) == {"a": 16.0, "b": 16.0}
    model.first_token("r1")
    assert model.costs(prompt, 8 * BLOCK) == {"a": 12.0, "b": 16.0}
    other = chain(2, 8)
    assert model.costs(other, 8 * BLOCK) == {"a": 24.0, "b": 16.0}, "a's active blocks are decode load"
    model.finished("r1")
    assert model.costs(other, 8 * BLOCK) == {"a": 16.0, "b": 16.0}


def test_a_reservation_on_a_given_worker_counts_the_prefill_tokens_it_is_given() -> None:
    model = router()
    prompt = chain(1, 8)
    model.reserve("r1", "b", prompt, 40)  # the real router's pick, with the prefill tokens it counted
    # b: (40 queued + 128) / 16 + 8 active blocks the prompt shares; a: 8 + 8.
    assert model.costs(prompt, 8 * BLOCK) == {"a": 16.0, "b": 18.5}
    model.first_token("r1")
    assert model.costs(prompt, 8 * BLOCK) == {"a": 16.0, "b": 16.0}


def test_an_overlap_given_replaces_the_index_view() -> None:
    model = router()
    model.index.add("a", chain(1, 4))
    prompt = chain(1, 8)
    assert model.costs(prompt, 8 * BLOCK, overlap={"a": 0, "b": 6}) == {"a": 16.0, "b": 10.0}


def test_active_requests_cost_only_with_their_weight() -> None:
    model = router(decode_active_request_weight=3.0)
    model.route("r1", [], 8)
    model.first_token("r1")
    costs = model.costs([], 8)
    assert costs[model._active["r1"].replica] - min(costs.values()) == 3.0


def test_ties_go_to_a_random_worker_repeatably_per_seed() -> None:
    picks = {router(seed).route("r", chain(1, 4), 4 * BLOCK)[0] for seed in range(20)}
    assert picks == {"a", "b"}
    assert router(7).route("r", chain(1, 4), 4 * BLOCK) == router(7).route("r", chain(1, 4), 4 * BLOCK)
    assert router(7).route("r", chain(1, 4), 4 * BLOCK)[1] == "kv-cost-tie"


@pytest.mark.parametrize("seed", [0, 1])
def test_the_modelled_router_runs_in_virtual_time_and_releases_every_reservation(seed: int) -> None:
    fleet = VirtualFleet(DYNAMO_MODELLED, SimFleet(replicas=3, num_blocks=256, costs=COSTS), seed)
    results = fleet.run(REQUESTS).load.results
    assert len(results) == len(REQUESTS) and all(r.ok for r in results)
    assert isinstance(fleet.peer, DynamoKVRouter)
    assert not fleet.peer._active and not any(fleet.peer._prefill_tokens.values())
    assert all(not blocks for blocks in fleet.peer._blocks.values())
    for backend in fleet.backends:
        cached = backend.replica.block_manager.num_cached_blocks
        assert len(fleet.peer.index._held[backend.replica.name]) == cached, "the index follows the KV events"
