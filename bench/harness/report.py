"""Turn per-request results into the comparison: a table (printed, JSON, Markdown) and PNG plots."""

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import orjson
from matplotlib.figure import Figure

from bench.harness.bounds import Bounds
from bench.harness.burst_report import burst_markdown, burst_placements
from bench.harness.loadgen import LoadResult, RequestResult
from bench.harness.users_table import DEFAULT_ITL_SLO_S, users_markdown, users_row


@dataclass(frozen=True)
class ContenderRow:
    contender: str
    requests: int
    errors: int
    hit_rate: float
    """Engine-reported cached prompt tokens / prompt tokens, over successful requests."""
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    throughput_tok_s: float
    """Output tokens per second of wall time."""
    goodput_rps: float
    """Requests per second that finished with TTFT within the SLO."""
    load_max_over_mean: float
    """Most requests any replica served / mean per replica (1.0 is perfectly even)."""
    duration_s: float


def summarize(contender: str, load: LoadResult, replica_requests: Sequence[int], ttft_slo_s: float) -> ContenderRow:
    ok = [result for result in load.results if result.ok]
    prompt_tokens = sum(result.prompt_tokens for result in ok)
    ttfts = [result.ttft_s for result in ok if result.ttft_s is not None]
    tpots = [_tpot(result) for result in ok if result.output_tokens > 1 and result.e2e_s is not None]
    mean_load = statistics.fmean(replica_requests) if replica_requests else 0.0
    duration = max(load.duration_s, 1e-9)
    return ContenderRow(
        contender=contender,
        requests=len(load.results),
        errors=len(load.results) - len(ok),
        hit_rate=sum(result.cached_tokens for result in ok) / prompt_tokens if prompt_tokens else 0.0,
        ttft_p50_s=_percentile(ttfts, 50),
        ttft_p99_s=_percentile(ttfts, 99),
        tpot_p50_s=_percentile(tpots, 50),
        throughput_tok_s=sum(result.output_tokens for result in ok) / duration,
        goodput_rps=sum(1 for ttft in ttfts if ttft <= ttft_slo_s) / duration,
        load_max_over_mean=max(replica_requests) / mean_load if mean_load else 0.0,
        duration_s=duration,
    )


def _tpot(result: RequestResult) -> float:
    assert result.e2e_s is not None and result.ttft_s is not None
    return (result.e2e_s - result.ttft_s) / (result.output_tokens - 1)


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def markdown_table(rows: Sequence[ContenderRow], bounds: Bounds | None, ttft_slo_s: float) -> str:
    lines = [
        f"| contender | hit rate | TTFT p50 (s) | TTFT p99 (s) | TPOT p50 (ms) | output tok/s | goodput (req/s, TTFT <= {ttft_slo_s:g} s) | load max/mean | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.contender} | {row.hit_rate:.1%} | {row.ttft_p50_s:.3f} | {row.ttft_p99_s:.3f} | "
            f"{row.tpot_p50_s * 1000:.1f} | {row.throughput_tok_s:.1f} | {row.goodput_rps:.2f} | "
            f"{row.load_max_over_mean:.2f} | {row.errors}/{row.requests} |"
        )
    if bounds is not None:
        lines.append(
            f"| bound: pooled LRU ({bounds.pooled_capacity_blocks} blocks) | {bounds.pooled_lru:.1%} | | | | | | | |"
        )
        lines.append(f"| bound: infinite cache | {bounds.infinite_cache:.1%} | | | | | | | |")
    return "\n".join(lines)


def write_report(
    out_dir: Path,
    title: str,
    rows: Sequence[ContenderRow],
    loads: dict[str, LoadResult],
    bounds: Bounds | None,
    ttft_slo_s: float,
    failures: dict[str, str],
    meta: Mapping[str, object],
    itl_slo_s: float = DEFAULT_ITL_SLO_S,
) -> str:
    """Write report.json, report.md, hit_rate.png and ttft_cdf.png; return the Markdown.

    Below the main table: what users measure (``bench/harness/users_table.py``, goodput within
    ``ttft_slo_s`` and ``itl_slo_s``) and, for a hotspot burst, where each contender sent it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    users = [users_row(name, load, ttft_slo_s, itl_slo_s) for name, load in loads.items()]
    bursts = burst_placements(loads)
    markdown = f"## {title}\n\n{markdown_table(rows, bounds, ttft_slo_s)}\n"
    if users:
        markdown += f"\n{users_markdown(users, ttft_slo_s, itl_slo_s)}\n"
    if bursts:
        markdown += f"\n{burst_markdown(bursts)}\n"
    markdown += "".join(f"\nCould not run {name}: {why}\n" for name, why in failures.items())
    (out_dir / "report.md").write_text(markdown)
    document = {
        "title": title,
        "meta": meta,
        "failures": failures,
        "rows": [asdict(row) for row in rows],
        "bounds": asdict(bounds) if bounds else None,
        "itl_slo_s": itl_slo_s,
        "users": [asdict(row) for row in users],
        "burst": [asdict(row) for row in bursts],
        "requests": {name: [asdict(result) for result in load.results] for name, load in loads.items()},
    }
    (out_dir / "report.json").write_bytes(
        orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
    )
    plot_hit_rates(out_dir / "hit_rate.png", title, rows, bounds)
    plot_ttft_cdf(out_dir / "ttft_cdf.png", title, loads)
    return markdown


def plot_hit_rates(path: Path, title: str, rows: Sequence[ContenderRow], bounds: Bounds | None) -> None:
    figure = Figure(figsize=(8, 4.5))
    axes = figure.subplots()
    names = [row.contender for row in rows]
    colors = [_KIND_COLORS.get(name.split(" ")[0], "tab:gray") for name in names]
    axes.barh(names, [row.hit_rate for row in rows], color=colors)
    if bounds is not None:
        axes.axvline(
            bounds.pooled_lru, color="black", linestyle="--", label=f"pooled LRU bound {bounds.pooled_lru:.1%}"
        )
        axes.axvline(
            bounds.infinite_cache,
            color="black",
            linestyle=":",
            label=f"infinite cache bound {bounds.infinite_cache:.1%}",
        )
        axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2, fontsize="small")
    axes.set_xlim(0, 1)
    axes.set_xlabel("prefix-cache hit rate (cached / prompt tokens)")
    axes.invert_yaxis()
    axes.set_title(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


_KIND_COLORS = {
    "kvgate": "tab:blue",
    "sglang-router": "tab:orange",
    "dynamo": "tab:green",
    "llm-d": "tab:purple",
    "direct": "tab:gray",
}


def plot_ttft_cdf(path: Path, title: str, loads: dict[str, LoadResult]) -> None:
    figure = Figure(figsize=(8, 4))
    axes = figure.subplots()
    for name, load in loads.items():
        ttfts = np.sort([result.ttft_s for result in load.results if result.ok])
        if len(ttfts):
            axes.plot(ttfts, np.arange(1, len(ttfts) + 1) / len(ttfts), label=name)
    axes.set_xscale("log")
    axes.set_xlabel("TTFT (s, log scale)")
    axes.set_ylabel("fraction of requests")
    axes.set_title(title)
    axes.legend(fontsize="small")
    axes.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
