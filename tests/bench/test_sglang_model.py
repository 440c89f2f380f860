"""The model of sglang-router's cache_aware that ``kvgate bench simulate --peers`` runs."""

from bench.harness.contenders import Contender
from bench.sim.peer_models import SGLANG_MODELLED, SglangPeer
from bench.sim.sglang_model import SglangCacheAware
from bench.sim.simulate import SimFleet, VirtualFleet
from tests.bench.test_simulate import COSTS, REQUESTS

BLOCK = 16


def chain(prefix: int, blocks: int) -> list[int]:
    """Block hashes of a prompt: ``blocks`` blocks, the same for the same ``prefix``."""
    return [prefix * 1000 + position for position in range(blocks)]


def test_a_match_over_the_threshold_goes_where_the_prompt_went_before() -> None:
    model = SglangCacheAware(["a", "b", "c"], BLOCK)
    assert model.route(chain(1, 10), 10 * BLOCK) == ("a", "smallest-tree")
    follow_up = chain(1, 10) + chain(2, 10)
    assert model.route(follow_up, 20 * BLOCK) == ("a", "cache-hit"), "10 of 20 blocks: 50 % > 30 %"


def test_a_match_at_or_under_the_threshold_goes_to_the_smallest_tree() -> None:
    model = SglangCacheAware(["a", "b", "c"], BLOCK)
    model.route(chain(1, 3), 3 * BLOCK)
    assert model.tree_tokens == {"a": 3 * BLOCK, "b": 0, "c": 0}
    long_prompt = chain(1, 3) + chain(2, 7)
    assert model.route(long_prompt, 10 * BLOCK) == ("b", "smallest-tree"), "3 of 10 blocks is not over 30 %"
    assert model.route(chain(3, 1), BLOCK) == ("c", "smallest-tree")


def test_the_tree_never_forgets_what_it_sent() -> None:
    """It does not follow the engines' evictions: a prefix stays with its first worker."""
    model = SglangCacheAware(["a", "b"], BLOCK)
    model.route(chain(1, 4), 4 * BLOCK)
    for other in range(2, 40):
        model.route(chain(other, 4), 4 * BLOCK)
    assert model.route(chain(1, 4), 4 * BLOCK) == ("a", "cache-hit")


def test_imbalance_sends_to_the_least_loaded_worker_whatever_it_holds() -> None:
    model = SglangCacheAware(["a", "b"], BLOCK, balance_abs_threshold=2, balance_rel_threshold=1.5)
    model.route(chain(1, 4), 4 * BLOCK)
    for _ in range(2):
        assert model.route(chain(1, 4), 4 * BLOCK) == ("a", "cache-hit")
    assert model.load == {"a": 3, "b": 0}
    assert model.route(chain(1, 4), 4 * BLOCK) == ("b", "imbalanced"), "3 - 0 > 2 and 3 > 1.5 x 0"
    model.finished("a")
    model.finished("a")
    assert model.route(chain(1, 4), 4 * BLOCK) == ("a", "cache-hit"), "1 - 1 is balanced again"


def test_the_modelled_contender_runs_in_virtual_time_and_keeps_prefixes_together() -> None:
    fleet = SimFleet(replicas=3, num_blocks=256, costs=COSTS)
    modelled = VirtualFleet(SGLANG_MODELLED, fleet)
    results = modelled.run(REQUESTS).load.results
    assert len(results) == len(REQUESTS) and all(r.ok for r in results)
    assert isinstance(modelled.peer, SglangPeer) and sum(modelled.peer.model.load.values()) == 0, "all finished"
    direct = VirtualFleet(Contender("direct", "round_robin"), fleet).run(REQUESTS).load.results

    def hits(results: list) -> float:
        return sum(r.cached_tokens for r in results) / sum(r.prompt_tokens for r in results)

    assert hits(results) > hits(direct) + 0.2
    assert {r.route_reason for r in results} <= {"cache-hit", "smallest-tree", "imbalanced"}
