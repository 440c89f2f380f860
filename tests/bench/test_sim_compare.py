"""``bench simulate --compare-with-run``: a simulation beside a written ``bench run`` report."""

from dataclasses import asdict
from pathlib import Path

import orjson

from bench.harness.loadgen import LoadResult, RequestResult
from bench.harness.report import ContenderRow
from bench.sim.sim_compare import compare_with_run

NAME = "kvgate cache_aware"


def row(hit_rate: float, ttft_p50_s: float) -> ContenderRow:
    return ContenderRow(NAME, 2, 0, hit_rate, ttft_p50_s, 2 * ttft_p50_s, 0.01, 100.0, 2.0, 1.0, 1.0)


def result(request_id: str, ttft_s: float, backend: str) -> RequestResult:
    return RequestResult(request_id, "g", 0.0, 200, ttft_s, backend=backend)


def write_run(path: Path, run_row: ContenderRow, results: list[RequestResult]) -> Path:
    document = {
        "meta": {"finished_at": "2026-11-30 16:00:00 UTC"},
        "rows": [asdict(run_row)],
        "requests": {NAME: [asdict(r) for r in results]},
    }
    path.write_bytes(orjson.dumps(document))
    return path


def test_a_simulation_within_the_check_passes_with_the_per_request_gap(tmp_path: Path) -> None:
    run = write_run(
        tmp_path / "run.json", row(0.170, 0.250), [result("a", 0.250, "replica-0"), result("b", 0.330, "replica-2")]
    )
    simulated = LoadResult([result("a", 0.220, "replica-0"), result("b", 0.300, "replica-1")], 1.0)
    table = compare_with_run(run, [row(0.165, 0.220)], {NAME: simulated})
    line = next(line for line in table.splitlines() if line.startswith(f"| {NAME}"))
    assert "| +30 ms | 1/2 | pass |" in line


def test_a_ttft_p50_off_by_more_than_20_percent_or_hits_off_by_a_point_fail(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run.json", row(0.170, 0.400), [result("a", 0.400, "replica-0")])
    simulated = LoadResult([result("a", 0.200, "replica-0")], 1.0)
    table = compare_with_run(run, [row(0.155, 0.200)], {NAME: simulated})
    assert "FAIL: hit rate, TTFT p50" in table
