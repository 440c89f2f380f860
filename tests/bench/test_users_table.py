"""The users' table: TTFT, E2E, output tokens, goodput within both service levels, shed and errors,
each against round robin."""

from bench.harness.loadgen import LoadResult, RequestResult
from bench.harness.users_table import users_markdown, users_row


def result(name: str, ttft: float, itl: list[float], status: int = 200) -> RequestResult:
    ok = status == 200
    return RequestResult(
        name,
        "",
        0.0,
        status=status,
        ttft_s=ttft if ok else None,
        itl_s=itl,
        e2e_s=ttft + sum(itl) if ok else None,
        output_tokens=len(itl) + 1 if ok else 0,
        error=None if ok else "refused",
    )


def test_goodput_needs_both_ttft_and_mean_itl_within_bounds() -> None:
    load = LoadResult(
        [
            result("fast", 0.1, [0.01, 0.01]),
            result("slow-first-token", 0.9, [0.01]),
            result("slow-tokens", 0.1, [0.05, 0.35]),
            result("one-token", 0.2, []),
            result("shed", 0.0, [], status=429),
            result("failed", 0.0, [], status=500),
        ],
        duration_s=2.0,
    )
    row = users_row("x", load, ttft_slo_s=0.5, itl_slo_s=0.1)
    assert row.goodput_fraction == 2 / 6 and row.goodput_rps == 1.0, "fast and one-token"
    assert row.shed_rate == row.error_rate == 1 / 6
    assert abs(row.ttft_avg_s - 0.325) < 1e-9
    assert row.output_tok_s == (3 + 2 + 3 + 1) / 2.0


def test_every_figure_carries_its_ratio_to_round_robin() -> None:
    direct = users_row("direct round_robin", LoadResult([result("a", 0.4, [0.02])], 1.0), 0.5, 0.1)
    kvgate = users_row("kvgate cache_aware", LoadResult([result("a", 0.1, [0.02])], 1.0), 0.5, 0.1)
    table = users_markdown([kvgate, direct], 0.5, 0.1)
    assert "TTFT <= 0.5 s and mean ITL <= 100 ms" in table
    line = next(line for line in table.splitlines() if line.startswith("| kvgate"))
    assert "0.100 (0.25x)" in line and "1.00 (1.00x)" in line
