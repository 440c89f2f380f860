"""``kvgate bench simulate-pd``: aggregated against P/D fleets of equal size, in virtual time.

On windows of a Mooncake trace (``--starts``) and token-id seeds (``--seeds``), at one GPU
preset, each policy runs the same requests over the same number of replicas
(bench/sim/sim_pd.py): aggregated (kvgate's router, every replica ``both``), always-disaggregate at
each P:D split of ``--splits``, kvgate's conditional decider (gateway/routing/pd_decider.py) on
the fleets of ``--conditional-splits`` (0: every replica ``both``) and of ``--conditional-mixed``
(so many ``prefill`` replicas, the others ``both``: "1P:7B"), and the modelled peers'
deciders (llm-d's threshold, Dynamo's conditional disaggregation) on ``--peer-split``. It prints
goodput (requests meeting TTFT <= ``--ttft-slo`` and mean ITL <= ``--itl-slo``, bench/harness/users_table.py)
per window, and whether kvgate's conditional P/D reached the better of aggregated and the best
always-disaggregate split there (the goal of issue 32).
"""

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.cli import TRACE_FILES, pairs
from bench.harness.contenders import Contender
from bench.harness.processes import REPO
from bench.harness.users_table import users_row
from bench.sim.seed_spread import paired_interval
from bench.sim.sim_pd import PdSetup, PdVirtualFleet, split_roles
from bench.sim.simulate import SimFleet
from bench.workloads.trace_replay import TraceReplayParams, generate
from engine.sim.sim_presets import GPU_PRESETS, preset_costs, preset_names
from planner.kv_math import kv_bytes_per_token
from planner.load import load_arch

CPU_MODEL = ("smollm2-135m", "float32")
"""The model and KV dtype of the CPU presets: the bundled engine's SmolLM2 on CPU."""


@dataclass(frozen=True)
class Policy:
    name: str
    prefill_replicas: int
    decider: str
    rest: str = "decode"
    """The role of the replicas beside the prefill ones: ``decode``, or ``both`` (a mixed fleet)."""

    def roles(self, replicas: int) -> tuple[str, ...]:
        return split_roles(replicas, self.prefill_replicas, self.rest)


def policies(args: argparse.Namespace) -> list[Policy]:
    chosen = [Policy("aggregated", 0, "never")]
    chosen += [Policy(f"always {p}P:{args.replicas - p}D", p, "always") for p in _ints(args.splits)]
    for p in _ints(args.conditional_splits):
        fleet = "all both" if p == 0 else f"{p}P:{args.replicas - p}D"
        chosen.append(Policy(f"kvgate conditional {fleet}", p, "kvgate"))
    for p in _ints(args.conditional_mixed):
        chosen.append(Policy(f"kvgate conditional {p}P:{args.replicas - p}B", p, "kvgate", "both"))
    split = f"{args.peer_split}P:{args.replicas - args.peer_split}D"
    chosen += [Policy(f"{decider} {split}", args.peer_split, decider) for decider in ("llm-d", "dynamo")]
    return chosen


def transfer_s_per_token(preset: str, bandwidth_gb_s: float) -> float:
    """KV bytes per token of the preset's model over the pull's bandwidth (each GPU of a TP group
    moves its own shard over its own link, so the group's bandwidth is TP times one link's)."""
    gpu = GPU_PRESETS.get(preset)
    model, dtype = (gpu.model, "bf16") if gpu else CPU_MODEL
    links = gpu.tensor_parallel if gpu else 1
    return kv_bytes_per_token(load_arch(model), dtype) / (bandwidth_gb_s * 1e9 * links)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvgate bench simulate-pd", description=__doc__)
    parser.add_argument("--preset", choices=preset_names(), default="llama-3-8b-h100")
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--trace", choices=sorted(TRACE_FILES), default="conversation")
    parser.add_argument("--trace-dir", type=Path, default=REPO.parent / "shared" / "traces")
    parser.add_argument("--starts", default="0,800,1600", help="first record of each trace window")
    parser.add_argument("--max-requests", type=int, default=400, help="records per window")
    parser.add_argument("--seeds", default="0", help="token-id (and arrival jitter) seeds (comma-separated)")
    parser.add_argument(
        "--arrival-jitter-ms",
        type=float,
        default=0.0,
        help="each arrival moves later by a seeded uniform draw below this many trace ms "
        "(the trace's timestamp resolution: 3000 conversation, 1 synthetic; 0: as written)",
    )
    parser.add_argument("--block-tokens", type=int, default=512, help="tokens per trace hash id (512: real lengths)")
    parser.add_argument("--time-compression", type=float, default=16.0, help="trace time divided by this")
    parser.add_argument("--max-output-tokens", type=int, default=256)
    parser.add_argument("--max-prompt-tokens", type=int, default=7936)
    parser.add_argument("--splits", default="2,3,4", help="prefill replicas of the always-disaggregate fleets")
    parser.add_argument(
        "--conditional-splits", default="0,2", help="prefill replicas of kvgate's conditional fleets (0: all both)"
    )
    parser.add_argument(
        "--conditional-mixed",
        default="",
        help="prefill replicas of kvgate's conditional fleets whose other replicas are both (none by default)",
    )
    parser.add_argument("--peer-split", type=int, default=2, help="prefill replicas of the peers' decider fleets")
    parser.add_argument("--kv-bandwidth-gb-s", type=float, default=25.0, help="KV pull bandwidth per GPU, GB/s")
    parser.add_argument(
        "--client-max-tokens",
        type=int,
        default=None,
        help="clients send this max_tokens and answers still end at the trace's length (default: the trace's length)",
    )
    parser.add_argument("--ttft-slo", type=float, default=2.0)
    parser.add_argument("--itl-slo", type=float, default=0.05, help="mean inter-token latency bound, seconds")
    parser.add_argument(
        "--routing", action="append", default=[], metavar="KEY=VALUE", help="kvgate routing: setting (YAML value)"
    )
    parser.add_argument("--only", default="", help="run only the policies whose name contains one of these (comma)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    trace = args.trace_dir / TRACE_FILES[args.trace]
    if not trace.is_file():
        print(f"skipping: {trace} not found (pass --trace-dir DIR holding {TRACE_FILES[args.trace]})")
        return 0
    routing = {key: yaml.safe_load(value) for key, value in pairs(args.routing, "--routing").items()}
    gpu = GPU_PRESETS.get(args.preset)
    fleet = SimFleet(
        replicas=args.replicas,
        num_blocks=gpu.kv_blocks(16) if gpu else 8192,
        costs=preset_costs(args.preset),
        client_max_tokens=args.client_max_tokens,
    )
    per_token = transfer_s_per_token(args.preset, args.kv_bandwidth_gb_s)
    chosen = [p for p in policies(args) if not args.only or any(part in p.name for part in args.only.split(","))]
    print(
        f"# {args.preset}, {args.replicas} replicas x {fleet.num_blocks} blocks, {args.trace} trace, "
        f"{args.max_requests} requests a window, time / {args.time_compression:g}, KV {per_token * 1e6:.2f} us/token; "
        f"goodput % at TTFT <= {args.ttft_slo:g} s and mean ITL <= {args.itl_slo * 1e3:g} ms (splits: requests split)",
        flush=True,
    )
    print("| window | seed | " + " | ".join(p.name for p in chosen) + " | conditional >= best other |")
    print("|---" * (len(chosen) + 3) + "|")
    goodputs: dict[str, list[float]] = {p.name: [] for p in chosen}
    windows: dict[int, list[dict[str, float]]] = {}
    for start in _ints(args.starts):
        for seed in _ints(args.seeds):
            params = TraceReplayParams(
                trace_file=str(trace),
                start=start,
                max_requests=args.max_requests,
                block_tokens=args.block_tokens,
                time_compression=args.time_compression,
                max_prompt_tokens=args.max_prompt_tokens,
                max_output_tokens=args.max_output_tokens,
                seed=seed,
                arrival_jitter_ms=args.arrival_jitter_ms,
            )
            requests = generate(params)
            cells = []
            window: dict[str, float] = {}
            for policy in chosen:
                started = time.perf_counter()
                setup = PdSetup(policy.roles(args.replicas), policy.decider, per_token)
                sim = PdVirtualFleet(contender_for(policy, routing), fleet, setup, seed)
                outcome = sim.run(requests)
                row = users_row(policy.name, outcome.load, args.ttft_slo, args.itl_slo)
                window[policy.name] = row.goodput_fraction * 100
                goodputs[policy.name].append(window[policy.name])
                cells.append(f"{window[policy.name]:.1f} ({sim.pd.split})")
                print(f"  {start}/{seed} {policy.name}: {time.perf_counter() - started:.1f} s", flush=True)
            print(f"| {start} | {seed} | " + " | ".join(cells) + f" | {_verdict(window)} |", flush=True)
            windows.setdefault(start, []).append(window)
    print("| mean (sd) | | " + " | ".join(_mean_sd(goodputs[p.name]) for p in chosen) + " | |")
    if len(_ints(args.seeds)) > 1:
        print("\n" + "\n".join(seed_summary(windows)))
    return 0


def seed_summary(windows: dict[int, list[dict[str, float]]]) -> list[str]:
    """Per window over its seeds, each conditional fleet against the bar: the paired difference
    from the better of aggregated and always-disaggregate (by seed mean), with its 95 % t-interval,
    and whether it is at the bar (``level``: within the noise), ``ahead`` or ``behind`` beyond it."""
    lines = [
        "| window | seeds | bar | conditional fleet | conditional - bar, mean [95 % interval] | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for start, seeds in windows.items():
        others = [name for name in seeds[0] if _is_bar(name)]
        if not others:
            continue
        bar = max(others, key=lambda name: statistics.fmean(seed[name] for seed in seeds))
        for name in (name for name in seeds[0] if name.startswith("kvgate conditional")):
            interval = paired_interval([seed[name] - seed[bar] for seed in seeds])
            lines.append(
                f"| {start} | {len(seeds)} | {bar} | {name} | {interval.mean:+.1f} "
                f"[{interval.low:+.1f}, {interval.high:+.1f}] | {interval.verdict(better=1)} |"
            )
    return lines


def contender_for(policy: Policy, routing: dict) -> Contender:
    """kvgate as the gateway would be configured for ``policy``: a conditional fleet of ``both``
    replicas only disaggregates with ``routing.disaggregation.among_both``."""
    if policy.decider == "kvgate" and policy.prefill_replicas == 0:
        disaggregation = {**routing.get("disaggregation", {}), "among_both": True}
        routing = {**routing, "disaggregation": disaggregation}
    return Contender("kvgate", "cache_aware", routing=routing)


def _verdict(window: dict[str, float]) -> str:
    """Per conditional fleet: whether it reached the better of aggregated and the best always split."""
    others = [value for name, value in window.items() if _is_bar(name)]
    if not others:
        return "-"
    target = max(others)
    verdicts = [
        f"{'yes' if value >= target else 'no'} ({value - target:+.1f})"
        for name, value in window.items()
        if name.startswith("kvgate conditional")
    ]
    return ", ".join(verdicts) or "-"


def _is_bar(policy: str) -> bool:
    """The policies whose better one conditional P/D must reach: aggregated and always-disaggregate."""
    return policy == "aggregated" or policy.startswith("always")


def _mean_sd(values: list[float]) -> str:
    if not values:
        return "-"
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.1f} ({spread:.1f})"


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]
