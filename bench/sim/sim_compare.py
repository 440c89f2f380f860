"""``bench simulate --compare-with-run REPORT``: a simulation beside a ``bench run`` of the same workload.

Issue 13's check of the simulator: hit rate within 1 point and TTFT p50 within 20 % of the real
run. Besides the two tables' numbers it joins the runs request by request (request ids are the
workload's, so the same in both) and gives the median per-request TTFT gap (run - simulation)
and how many requests went to the same replica: a gap that is about constant per request is a
fixed cost the simulation leaves out (HTTP, gateway); one that grows with queueing is the real
replicas running slower than their cost model (a loaded machine).
"""

import statistics
from collections.abc import Sequence
from pathlib import Path

import orjson

from bench.harness.loadgen import LoadResult
from bench.harness.report import ContenderRow

HIT_RATE_POINTS = 0.01
"""The check: simulated hit rate within this much (absolute) of the real run's."""
TTFT_P50_RATIO = 0.20
"""The check: simulated TTFT p50 within this fraction of the real run's."""


def compare_with_run(run_report: Path, rows: Sequence[ContenderRow], loads: dict[str, LoadResult]) -> str:
    """A Markdown table, one line per contender found in both the simulation and ``run_report``."""
    document = orjson.loads(run_report.read_bytes())
    run_rows = {row["contender"]: row for row in document["rows"]}
    lines = [
        f"Simulation against `bench run` ({run_report}, finished {document['meta'].get('finished_at', '?')}):",
        "",
        "| contender | sim hits | run hits | sim TTFT p50 | run TTFT p50 | sim TTFT p99 | run TTFT p99 "
        "| per-request TTFT gap p50 | same replica | check |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        run = run_rows.get(row.contender)
        if run is None:
            continue
        gap_ms, same = _per_request(loads[row.contender], document["requests"].get(row.contender, []))
        hits_ok = abs(row.hit_rate - run["hit_rate"]) <= HIT_RATE_POINTS
        ttft_ok = abs(row.ttft_p50_s - run["ttft_p50_s"]) <= TTFT_P50_RATIO * run["ttft_p50_s"]
        check = (
            "pass"
            if hits_ok and ttft_ok
            else "FAIL: " + ", ".join(what for what, ok in (("hit rate", hits_ok), ("TTFT p50", ttft_ok)) if not ok)
        )
        lines.append(
            f"| {row.contender} | {row.hit_rate:.1%} | {run['hit_rate']:.1%} | {row.ttft_p50_s:.3f} s "
            f"| {run['ttft_p50_s']:.3f} s | {row.ttft_p99_s:.3f} s | {run['ttft_p99_s']:.3f} s "
            f"| {gap_ms:+.0f} ms | {same} | {check} |"
        )
    return "\n".join(lines) + "\n"


def _per_request(simulated: LoadResult, run_requests: list[dict]) -> tuple[float, str]:
    """Median TTFT gap (run - simulation) in ms over requests both served, and 'same replica' as k/n."""
    run_by_id = {request["request_id"]: request for request in run_requests}
    gaps, same, joined = [], 0, 0
    for result in simulated.results:
        run = run_by_id.get(result.request_id)
        if run is None or run["ttft_s"] is None or result.ttft_s is None:
            continue
        joined += 1
        gaps.append(run["ttft_s"] - result.ttft_s)
        same += run["backend"] == result.backend
    return (statistics.median(gaps) * 1000 if gaps else float("nan")), f"{same}/{joined}"
