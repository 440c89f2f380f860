"""`bench seed-spread`: paired differences over seeds whose arrivals differ, from real simulations."""

import math
from pathlib import Path

import orjson
import pytest

from bench.sim import seed_spread, simulate_cli
from bench.sim.peer_models import MODELLED, MODELLED_PEERS
from bench.sim.seed_spread import KVGATE, Interval, paired_interval


def test_the_interval_is_the_t_interval_of_the_mean() -> None:
    interval = paired_interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 / math.sqrt(3)
    assert interval.mean == 2.0
    assert interval.low == pytest.approx(2.0 - half) and interval.high == pytest.approx(2.0 + half)
    assert paired_interval([0.5]) == Interval(0.5, 0.5, 0.5)


def test_behind_only_when_the_whole_interval_is_on_the_wrong_side() -> None:
    assert Interval(0.1, 0.05, 0.2).verdict(better=1) == "ahead"
    assert Interval(0.1, 0.05, 0.2).verdict(better=-1) == "behind", "a higher p99 is worse"
    assert Interval(0.1, -0.05, 0.2).verdict(better=-1) == "level"
    assert Interval(-0.1, -0.2, -0.05).verdict(better=1) == "behind"


@pytest.fixture
def bucketed_trace(tmp_path: Path) -> Path:
    """A conversation-shaped trace: timestamps in 3 s steps, several requests a step, shared roots."""
    records = [
        {
            "timestamp": 3000 * (index // 6),
            "input_length": 2048 + 512 * (index % 5),
            "output_length": 20 + index % 7,
            "hash_ids": [0, 1, 100 + index, 200 + index, 300 + index, 400 + index, 500 + index],
        }
        for index in range(36)
    ]
    (tmp_path / "conversation_trace.jsonl").write_bytes(b"\n".join(orjson.dumps(r) for r in records) + b"\n")
    return tmp_path


def test_seeds_with_arrival_jitter_give_a_spread_and_one_row_per_window(bucketed_trace: Path) -> None:
    outs = []
    for seed in (0, 1, 2):
        out = bucketed_trace / f"seed{seed}"
        argv = ["--workload", "trace-replay", "--trace-dir", str(bucketed_trace), "--policy", "cache_aware"]
        argv += ["--peers", "--preset", "llama-3-8b-h100", "--replicas", "2", "--out", str(out)]
        argv += ["--set", "block_tokens=512", "--set", "time_compression=20", "--set", f"seed={seed}"]
        assert simulate_cli.main([*argv, "--set", "arrival_jitter_ms=3000"]) == 0
        outs.append(out)
    reports = [orjson.loads((out / "report.json").read_bytes()) for out in outs]
    p99s = [seed_spread.measures_of(report)[KVGATE]["ttft_p99_s"] for report in reports]
    assert len(set(p99s)) > 1, "arrivals that differ by seed give different runs"

    (row,) = seed_spread.compare(reports)
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1:3] == ["0", "3"]
    assert cells[0] == "llama-3-8b-h100 x 2, conversation"
    assert cells[3].startswith(f"{sum(p99s) / 3:.3f} vs ")
    named = [peer.name.removesuffix(MODELLED) for peer in MODELLED_PEERS]
    assert any(f" {name} (" in cells[3] for name in named), "the best peer is named"
