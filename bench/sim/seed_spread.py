"""``kvgate bench seed-spread DIR...``: kvgate against the best modelled peer over seeds, per window.

``bench simulate`` is deterministic: one seed, one window, one answer. Whether kvgate's TTFT p99
on a window is behind a peer's by 1 % or by chance needs the same window under other seeds with
arrivals that differ (``--set arrival_jitter_ms``, bench/workloads/trace_replay.py), compared as
paired differences: each seed's kvgate value minus the same seed's value of the peer best on that
measure's seed mean, with the mean's 95 % t-interval. A window is *behind beyond its noise* only
where the whole interval is on the wrong side of 0.
"""

import argparse
import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson
from scipy import stats

from bench.sim.peer_models import MODELLED

KVGATE = "kvgate cache_aware"
MEASURES = (
    ("ttft_p99_s", "TTFT p99 (s)", -1, ".3f"),
    ("goodput_fraction", "goodput (%)", 1, ".2f"),
    ("hit_rate", "hit rate (%)", 1, ".2f"),
)
"""(report field, label, +1 where higher is better and -1 where lower is, number format)."""
FLEET = re.compile(r"\(simulated, ([^)]+)\), (\d+) replicas")


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    """``low`` .. ``high``: the 95 % t-interval of the mean (the mean itself with one value)."""

    def verdict(self, better: int) -> str:
        """Whether kvgate is ahead, level or behind beyond the noise (``better``: +1 higher is better)."""
        low, high = sorted((self.low * better, self.high * better))
        if low > 0:
            return "ahead"
        if high < 0:
            return "behind"
        return "level"


def paired_interval(differences: Sequence[float], confidence: float = 0.95) -> Interval:
    """The mean of ``differences`` and its two-sided t-interval."""
    mean = statistics.fmean(differences)
    if len(differences) < 2:
        return Interval(mean, mean, mean)
    half = stats.t.ppf(0.5 + confidence / 2, len(differences) - 1) * statistics.stdev(differences)
    half /= len(differences) ** 0.5
    return Interval(mean, mean - half, mean + half)


def window_key(report: dict) -> tuple[str, int, float]:
    """What makes two reports the same window under different seeds: fleet, trace, start, compression."""
    params = report["meta"]["params"]
    match = FLEET.search(report["title"])
    fleet = f"{match[1]} x {match[2]}" if match else report["title"]
    trace = Path(params["trace_file"]).stem.removesuffix("_trace")
    return f"{fleet}, {trace}", params["start"], params["time_compression"]


def measures_of(report: dict) -> dict[str, dict[str, float]]:
    """Per contender: TTFT p99 (s), goodput (% of requests), hit rate (%)."""
    values: dict[str, dict[str, float]] = defaultdict(dict)
    for row in report["users"]:
        values[row["contender"]]["ttft_p99_s"] = row["ttft_p99_s"]
        values[row["contender"]]["goodput_fraction"] = row["goodput_fraction"] * 100
    for row in report["rows"]:
        values[row["contender"]]["hit_rate"] = row["hit_rate"] * 100
    return values


def compare(reports: Sequence[dict]) -> list[str]:
    """Markdown rows, one per window: each measure's paired difference, kvgate minus the peer best
    on that measure by seed mean (named in the cell)."""
    by_window: dict[tuple[str, int, float], list[dict[str, dict[str, float]]]] = defaultdict(list)
    for report in reports:
        by_window[window_key(report)].append(measures_of(report))
    lines = []
    for key in sorted(by_window):
        seeds = by_window[key]
        peers = [name for name in seeds[0] if name.endswith(MODELLED)]
        cells = []
        for field, _, better, form in MEASURES:
            best = max(peers, key=lambda name: better * statistics.fmean(seed[name][field] for seed in seeds))
            interval = paired_interval([seed[KVGATE][field] - seed[best][field] for seed in seeds])
            kvgate = statistics.fmean(seed[KVGATE][field] for seed in seeds)
            peer = statistics.fmean(seed[best][field] for seed in seeds)
            cells.append(
                f"{kvgate:{form}} vs {peer:{form}} {best.removesuffix(MODELLED)} ({interval.mean:+{form}} "
                f"[{interval.low:+{form}}, {interval.high:+{form}}]) {interval.verdict(better)}"
            )
        lines.append(f"| {key[0]} | {key[1]} | {len(seeds)} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvgate bench seed-spread", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="`bench simulate --peers --out` directories")
    args = parser.parse_args(argv)
    reports = [orjson.loads((directory / "report.json").read_bytes()) for directory in args.dirs]
    header = " | ".join(f"{label}: kvgate vs best peer (difference [95 % interval])" for _, label, _, _ in MEASURES)
    print(f"| fleet and trace | window | seeds | {header} |")
    print("|---" * (3 + len(MEASURES)) + "|")
    for line in compare(reports):
        print(line)
    return 0
