"""Dynamo's cost knobs: parsed from the command line, named in the contenders, given to its model."""

import pytest

from bench.harness.contenders import contenders_for
from bench.peers.dynamo_config import DYNAMO_DEFAULTS, DynamoConfig, parse_dynamo_config
from bench.sim.peer_models import MODELLED, build_peer, modelled_peers
from bench.sim.simulate import SimFleet, VirtualFleet
from tests.bench.test_simulate import COSTS, REQUESTS


def test_knobs_parse_and_reach_the_environment_select_service_reads() -> None:
    config = parse_dynamo_config("overlap_score_credit=2, decode_active_request_weight=0.5")
    assert config == DynamoConfig(overlap_score_credit=2.0, decode_active_request_weight=0.5)
    assert config.env() == {
        "DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT": "2.0",
        "DYN_ROUTER_PREFILL_LOAD_SCALE": "1.0",
        "DYN_ROUTER_DECODE_ACTIVE_REQUEST_WEIGHT": "0.5",
    }
    assert config.changed() == "overlap_score_credit=2,decode_active_request_weight=0.5"
    assert parse_dynamo_config("default") == DYNAMO_DEFAULTS and DYNAMO_DEFAULTS.changed() == ""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("router_temperature=0.5", "unknown Dynamo knob 'router_temperature'"),
        ("overlap_score_credit", "unknown Dynamo knob 'overlap_score_credit'"),
        ("overlap_score_credit=high", "needs a number, not 'high'"),
        ("prefill_load_scale=-1", "must be >= 0"),
    ],
)
def test_a_bad_knob_is_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_dynamo_config(text)


def test_one_dynamo_contender_per_config_named_by_its_knobs() -> None:
    configs = [DYNAMO_DEFAULTS, DynamoConfig(overlap_score_credit=4.0)]
    dynamos = [c for c in contenders_for(["cache_aware"], peers=True, dynamo=configs) if c.kind == "dynamo"]
    assert [c.name for c in dynamos] == ["dynamo kv", "dynamo kv (overlap_score_credit=4)"]
    assert [DynamoConfig.from_settings(c.routing) for c in dynamos] == configs
    modelled = [c.name for c in modelled_peers(configs)]
    assert modelled[1:3] == ["dynamo kv-router (modelled)", "dynamo kv-router (overlap_score_credit=4) (modelled)"]
    assert all(name.endswith(MODELLED) for name in modelled), "seed-spread counts every one as a peer"


def test_the_model_runs_with_the_contenders_knobs() -> None:
    contender = modelled_peers([DynamoConfig(prefill_load_scale=0.0)])[1]
    peer = build_peer(contender, ["a", "b"], 16)
    assert peer.config == DynamoConfig(prefill_load_scale=0.0)  # type: ignore[attr-defined]
    fleet = VirtualFleet(contender, SimFleet(replicas=2, num_blocks=256, costs=COSTS))
    assert all(result.ok for result in fleet.run(REQUESTS).load.results)
