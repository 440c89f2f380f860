"""The table users measure a router by, as Dynamo's router A/B reports it: TTFT average, p50 and
p99, end-to-end average, output tokens per second, goodput, shed and error rates; each beside its
ratio to direct round robin on the same requests.

Goodput counts the requests that met both service levels: TTFT <= T and mean inter-token latency
<= I (a request with one output token has no ITL and meets the second). A request is shed when
the target refused it for load (HTTP 429 or 503); any other failure is an error.
"""

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bench.harness.loadgen import LoadResult, RequestResult

DEFAULT_ITL_SLO_S = 0.1
"""Mean inter-token latency bound of goodput when none is given."""
SHED_STATUSES = (429, 503)
BASELINE_PREFIX = "direct"
"""The contender the ratios are taken against: the client's round robin over the replicas."""


@dataclass(frozen=True)
class UsersRow:
    contender: str
    requests: int
    ttft_avg_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    e2e_avg_s: float
    output_tok_s: float
    goodput_rps: float
    """Requests per second that met TTFT <= T and mean ITL <= I."""
    goodput_fraction: float
    shed_rate: float
    error_rate: float


def users_row(contender: str, load: LoadResult, ttft_slo_s: float, itl_slo_s: float) -> UsersRow:
    results = load.results
    ok = [result for result in results if result.ok]
    ttfts = [result.ttft for result in ok]
    e2es = [result.e2e_s for result in ok if result.e2e_s is not None]
    met = sum(1 for result in ok if result.ttft <= ttft_slo_s and _mean_itl(result) <= itl_slo_s)
    shed = sum(1 for result in results if not result.ok and result.status in SHED_STATUSES)
    count = max(len(results), 1)
    duration = max(load.duration_s, 1e-9)
    return UsersRow(
        contender=contender,
        requests=len(results),
        ttft_avg_s=statistics.fmean(ttfts) if ttfts else float("nan"),
        ttft_p50_s=float(np.percentile(ttfts, 50)) if ttfts else float("nan"),
        ttft_p99_s=float(np.percentile(ttfts, 99)) if ttfts else float("nan"),
        e2e_avg_s=statistics.fmean(e2es) if e2es else float("nan"),
        output_tok_s=sum(result.output_tokens for result in ok) / duration,
        goodput_rps=met / duration,
        goodput_fraction=met / count,
        shed_rate=shed / count,
        error_rate=(len(results) - len(ok) - shed) / count,
    )


def _mean_itl(result: RequestResult) -> float:
    return statistics.fmean(result.itl_s) if result.itl_s else 0.0


def baseline_of(rows: Sequence[UsersRow]) -> UsersRow | None:
    return next((row for row in rows if row.contender.startswith(BASELINE_PREFIX)), None)


def _cell(row: UsersRow, base: UsersRow | None, name: str, digits: int, scale: float = 1.0) -> str:
    """``row``'s figure ``name``, and its ratio to ``base``'s when there is one to divide by."""
    value = getattr(row, name) * scale
    text = f"{value:.{digits}f}"
    base_value = getattr(base, name) * scale if base is not None else float("nan")
    if not base_value or np.isnan(base_value) or np.isnan(value):
        return text
    return f"{text} ({value / base_value:.2f}x)"


def users_markdown(rows: Sequence[UsersRow], ttft_slo_s: float, itl_slo_s: float) -> str:
    """The table; each figure followed by its ratio to round robin's when round robin ran."""
    base = baseline_of(rows)
    lines = [
        f"What users measure (ratio to {base.contender if base else 'round robin'} in brackets; goodput: "
        f"TTFT <= {ttft_slo_s:g} s and mean ITL <= {itl_slo_s * 1000:g} ms):",
        "",
        "| contender | TTFT avg (s) | TTFT p50 (s) | TTFT p99 (s) | E2E avg (s) | output tok/s | goodput (req/s) "
        "| goodput (% of requests) | shed | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cells = [
            _cell(row, base, "ttft_avg_s", 3),
            _cell(row, base, "ttft_p50_s", 3),
            _cell(row, base, "ttft_p99_s", 3),
            _cell(row, base, "e2e_avg_s", 3),
            _cell(row, base, "output_tok_s", 1),
            _cell(row, base, "goodput_rps", 2),
            _cell(row, base, "goodput_fraction", 1, scale=100.0),
            f"{row.shed_rate:.1%}",
            f"{row.error_rate:.1%}",
        ]
        lines.append(f"| {row.contender} | {' | '.join(cells)} |")
    return "\n".join(lines)
