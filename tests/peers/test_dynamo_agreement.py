"""The model of Dynamo's KV router picks the worker the real one picks (issue 31), on a short
window replayed through real ``kvgate engine --sim`` replicas and Dynamo's ``select_service``."""

from pathlib import Path

import orjson
import pytest

from bench.harness.contenders import dynamo_install_hint, dynamo_python
from bench.peers.dynamo_agreement import AgreementSettings, run_agreement
from bench.peers.dynamo_agreement_report import AGREE, TIE
from bench.peers.dynamo_config import DynamoConfig

pytestmark = pytest.mark.slow  # run_agreement starts engines and Dynamo (an import the conftest cannot see)

CONVERSATIONS = 6
TURNS = 5
BLOCK = 16


def write_trace(path: Path) -> None:
    """Mooncake-format records: conversations over one shared system prompt (hash id 0), each turn
    carrying the history of the one before, interleaved as sessions are in the published traces."""
    records = []
    for turn in range(TURNS):
        for conversation in range(CONVERSATIONS):
            history = [1000 * (conversation + 1) + block for block in range(2 + 2 * turn)]
            hash_ids = [0, *history]
            records.append({"input_length": 512 * len(hash_ids), "output_length": 64, "hash_ids": hash_ids})
    lines = [orjson.dumps({"timestamp": 100 * index, **record}) for index, record in enumerate(records)]
    path.write_bytes(b"\n".join(lines) + b"\n")


def test_the_model_picks_the_worker_dynamo_picks(tmp_path: Path) -> None:
    if not dynamo_python().exists():
        pytest.skip(dynamo_install_hint())
    trace = tmp_path / "trace.jsonl"
    write_trace(trace)
    settings = AgreementSettings(
        trace_file=trace, workdir=tmp_path / "run", requests=CONVERSATIONS * TURNS, replicas=2, num_blocks=1024
    )
    summary = run_agreement(settings)

    decisions = summary.decisions
    assert len(decisions) == CONVERSATIONS * TURNS
    assert not [d.error for d in decisions if d.error]
    assert summary.lost_event_batches == 0
    assert any(sum(d.dynamo_overlap.values()) for d in decisions), "later turns find their history cached"
    assert summary.overlap_agreement >= 0.9, summary.markdown()
    # Measured: every decision agreed but for ties drawn differently, and the model's cost of
    # Dynamo's pick was exactly the logit Dynamo logged for it.
    assert summary.agreement_excluding_ties >= 0.9, summary.markdown()
    assert summary.count(AGREE) + summary.count(TIE) >= 0.9 * len(decisions), summary.markdown()
    matching, checked = summary.logit_checks
    assert checked == len(decisions), "Dynamo logged a logit for every pick"
    assert matching >= 0.9 * checked, summary.markdown()


def test_dynamo_takes_its_cost_knobs_from_the_config_and_the_model_follows(tmp_path: Path) -> None:
    """select_service has no flags for its cost knobs: they reach it through the environment, and
    the logit it logs for each pick is the model's cost under the same knobs."""
    if not dynamo_python().exists():
        pytest.skip(dynamo_install_hint())
    trace = tmp_path / "trace.jsonl"
    write_trace(trace)
    knobs = DynamoConfig(prefill_load_scale=0.5, decode_active_request_weight=2.0)
    settings = AgreementSettings(
        trace_file=trace,
        workdir=tmp_path / "run",
        requests=CONVERSATIONS * TURNS,
        replicas=2,
        num_blocks=1024,
        dynamo=knobs,
    )
    summary = run_agreement(settings)

    first = summary.decisions[0]
    blocks = first.prompt_tokens // BLOCK
    # An idle fleet, nothing cached: 0.5 x the prompt's prefill blocks + its blocks; under Dynamo's
    # defaults (scale 1.0) it would log prompt_tokens / 16 + blocks.
    assert first.dynamo_logit == pytest.approx(0.5 * first.prompt_tokens / BLOCK + blocks)
    matching, checked = summary.logit_checks
    assert checked == len(summary.decisions)
    assert matching >= 0.9 * checked, summary.markdown()
