"""The hotspot burst: one new system prompt arriving many times at once, and where it went."""

import copy

from bench.harness.burst_report import burst_markdown, burst_placements
from bench.harness.contenders import Contender
from bench.sim.peer_models import MODELLED_PEERS
from bench.sim.simulate import SimFleet, VirtualFleet
from bench.workloads.hotspot_burst import BURST_GROUP, HotspotBurstParams, generate
from tests.bench.test_simulate import COSTS

PARAMS = HotspotBurstParams(burst_size=24, burst_at_s=2.0, system_prompt_len=512, duration_s=4.0, background_rate=6)


def test_the_burst_shares_one_prefix_nobody_sent_before_and_arrives_at_once() -> None:
    requests = generate(PARAMS)
    burst = [r for r in requests if r.group == BURST_GROUP]
    background = [r for r in requests if r.group != BURST_GROUP]
    assert len(burst) == 24 and {r.arrival_s for r in burst} == {2.0}
    assert len({r.prompt_ids[:512] for r in burst if r.prompt_ids}) == 1
    burst_prefix = burst[0].prompt_ids[:512] if burst[0].prompt_ids else ()
    assert all(r.prompt_ids and r.prompt_ids[:512] != burst_prefix for r in background)
    assert any(r.arrival_s < 2.0 for r in background) and any(r.arrival_s > 2.0 for r in background)
    assert [r.arrival_s for r in requests] == sorted(r.arrival_s for r in requests)


def test_every_contender_places_the_whole_burst_and_the_report_counts_it() -> None:
    requests = generate(PARAMS)
    fleet = SimFleet(replicas=3, num_blocks=256, costs=COSTS)
    contenders = [Contender("kvgate", "cache_aware"), Contender("direct", "round_robin"), *MODELLED_PEERS]
    loads = {c.name: VirtualFleet(c, fleet).run(requests).load for c in contenders}
    rows = burst_placements(loads)
    assert [row.contender for row in rows] == [c.name for c in contenders]
    assert all(sum(row.per_replica.values()) == 24 for row in rows)
    direct = next(row for row in rows if row.contender.startswith("direct"))
    assert list(direct.per_replica.values()) == [8, 8, 8]
    assert all(row.ttft_p99_s >= row.ttft_p50_s > 0 for row in rows)
    assert "8 / 8 / 8" in burst_markdown(rows)


def test_each_contender_is_counted_on_its_own_replicas_and_a_silent_router_says_so() -> None:
    """``bench run`` gives every contender fresh replicas at other addresses: one contender's
    replicas are not columns of another's, and a router that names no backend is not shown as
    sending the burst nowhere."""
    requests = generate(PARAMS)
    fleet = SimFleet(replicas=3, num_blocks=256, costs=COSTS)
    direct = VirtualFleet(Contender("direct", "round_robin"), fleet).run(requests).load
    moved = copy.deepcopy(direct)
    for result in moved.results:
        result.backend = f"http://127.0.0.1:90{result.backend[-1]}" if result.backend else None
    silent = copy.deepcopy(direct)
    for result in silent.results:
        result.backend = None
    rows = burst_placements({"here": direct, "elsewhere": moved, "silent": silent})
    assert [list(row.per_replica.values()) for row in rows] == [[8, 8, 8], [8, 8, 8], []]
    markdown = burst_markdown(rows)
    assert "| here | 8 / 8 / 8 | 1.00 |" in markdown and "| elsewhere | 8 / 8 / 8 | 1.00 |" in markdown
    assert "| silent | not reported by the router | – |" in markdown
