"""``kvgate bench``: ``run`` compares routers on a workload; every other subcommand is a benchmark
module of its own, each also runnable alone (``python -m`` on its module, e.g. ``bench.micro.overhead``)."""

import argparse
import dataclasses
import signal
import subprocess
import sys
from collections.abc import Callable
from importlib import import_module
from pathlib import Path

import yaml

from bench.harness.contenders import FleetSpec, contenders_for, sglang_install_hint, sglang_router_binary
from bench.harness.processes import REPO
from bench.harness.runner import RunSettings, run_benchmark
from bench.peers.dynamo_config import DYNAMO_DEFAULTS, add_dynamo_argument
from bench.workloads import WORKLOADS
from engine.sim.sim_runner import SIM_PRESETS, SimCosts

DEFAULT_NUM_BLOCKS = {
    "shared-prefix": 3072,
    "skew": 3072,
    "hotspot-burst": 3072,
    "multi-turn": 1024,
    "trace-replay": 8192,
    "normalization-noise": 2304,
}
"""KV blocks per replica: for shared prefix, each of 4 replicas holds about 3/8 of all group prefixes."""

TRACE_FILES = {"conversation": "conversation_trace.jsonl", "synthetic": "synthetic_trace.jsonl"}

RUN_SUMMARY = "kvgate's policies against direct round robin and peers on one workload"

DELEGATED: dict[str, tuple[str, str]] = {
    "simulate": ("bench.sim.simulate_cli", "the same comparison in virtual time, in one process"),
    "simulate-pd": (
        "bench.sim.sim_pd_cli",
        "aggregated against P/D fleets (always, conditional, peers) in virtual time",
    ),
    "seed-spread": (
        "bench.sim.seed_spread",
        "kvgate against the best modelled peer per window, over seeds: paired differences, 95 % intervals",
    ),
    "pd-itl": ("bench.engine.pd_itl", "short requests' decode ITL while long prompts arrive: aggregated vs P/D, CPU"),
    "overhead": ("bench.micro.overhead", "added latency of kvgate and sglang-router over a zero-latency backend"),
    "epp-latency": ("bench.micro.epp_latency", "added latency and picks/s of `kvgate epp` beside the HTTP gateway's"),
    "overhead-ab": ("bench.micro.overhead_ab", "added latency and CPU per request of gateway trees, interleaved A/B"),
    "throughput": ("bench.micro.throughput", "highest request rate with p99 under a bound, per --workers count (wrk)"),
    "soak": ("bench.micro.soak", "minutes of mixed load with KV events, a reload and a replica kill: event-loop lag"),
    "zero-backend": ("bench.harness.zero_backend", "serve a zero-latency OpenAI-compatible backend for overhead runs"),
    "request-stages": ("bench.micro.request_stages", "gateway CPU of each stage of the chat request path, in process"),
    "normalize-cost": (
        "bench.micro.normalize_cost",
        "gateway CPU per request for normalize, template, tokenize, hashes",
    ),
    "limiter-cost": ("bench.micro.limiter_cost", "cost per request of shared limits, in process against Redis"),
    "redis-recovery": ("bench.micro.redis_recovery", "how soon the Redis limiter sees a restarted Redis"),
    "gpu-step-cost": (
        "bench.micro.gpu_step_cost",
        "a GPU preset's steps timed on this GPU beside what the preset charges",
    ),
    "index-cost": (
        "bench.micro.index_cost",
        "prefix index: match + insert time of a 4,096-token prompt, bytes per block",
    ),
    "engine-throughput": ("bench.engine.throughput", "engine throughput and TTFT against transformers' batching"),
    "engine-prefix-ttft": ("bench.engine.prefix_ttft", "engine TTFT of a long prompt with its prefix cached vs cold"),
    "engine-step-profile": ("bench.engine.step_profile", "where one engine runner step's time goes"),
    "engine-runner-timing": ("bench.engine.runner_timing", "time the model runner's prefill and decode; fit sim costs"),
    "engine-request-cost": ("bench.engine.request_cost", "engine TTFT, page faults and CPU time of one request"),
    "engine-load-reading": ("bench.engine.load_reading_cost", "the engine's load reading per step as its queue grows"),
    "engine-grammar": ("bench.engine.grammar_decode", "decode tokens/s with and without a JSON schema"),
    "engine-matmul": ("bench.engine.matmul_libraries", "GFLOP/s of MKL and oneDNN on the engine's matrices"),
    "engine-vs-vllm": ("bench.engine.engine_vs_vllm", "the bundled engine against vLLM on CPU, same model and dtype"),
    "vllm-gateway-check": ("bench.peers.vllm_gateway_check", "the gateway in front of a real vLLM, end to end"),
    "hf-export": ("bench.peers.hf_export", "save a kvgate model as a plain HF folder a peer engine loads"),
    "dynamo-proxy": (
        "bench.peers.dynamo_proxy",
        "tokenizing proxy in front of Dynamo's select_service (the dynamo peer)",
    ),
    "dynamo-agreement": ("bench.peers.dynamo_agreement", "the Dynamo router model against the real one, per decision"),
    "lm-eval-parity": ("bench.peers.lm_eval_parity", "lm-eval scores: engine direct, through the gateway, and hf"),
}
"""Subcommands handed whole to another module's ``main(argv)`` (which parses its own flags)."""

SPAWNED: dict[str, tuple[str, str]] = {
    "index-cost-ab": (
        "bench/micro/index_cost_ab.py",
        "prefix index: two source trees interleaved on index-cost's workload",
    ),
    "index-cost-shapes": (
        "bench/micro/index_cost_shapes.py",
        "prefix index CPU per operation on other shapes, one tree",
    ),
}
"""Subcommands run as a fresh ``python FILE``: they import ``radix`` and ``bench`` from the tree they are given."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvgate bench",
        description=__doc__,
        epilog=_command_list(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="one of the commands below")
    run = commands.add_parser("run", description=RUN_SUMMARY)
    run.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    run.add_argument("--replicas", type=int, default=4)
    run.add_argument(
        "--replica-url",
        action="append",
        default=[],
        metavar="URL",
        help="use this running replica (repeatable) instead of starting simulated ones",
    )
    run.add_argument("--policy", default="all", help="comma-separated kvgate policies, or all (default: %(default)s)")
    run.add_argument(
        "--peers", action="store_true", help="also run Dynamo's KV router and sglang-router (cache_aware, round_robin)"
    )
    add_dynamo_argument(run, repeatable=True)
    run.add_argument(
        "--num-blocks",
        type=int,
        help="KV blocks per replica (default: per workload); with --replica-url, what they hold",
    )
    run.add_argument("--block-size", type=int, default=16)
    run.add_argument(
        "--sim-prefill-us",
        type=float,
        default=75.0,
        help="compress time: scale every constant of the calibrated smollm2-cpu cost model by one factor "
        "so that prefill costs this many microseconds per token (default: %(default)s)",
    )
    run.add_argument(
        "--engine-arg", action="append", default=[], metavar="FLAG", help="extra `kvgate engine` flag (repeatable)"
    )
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="workload parameter (repeatable)")
    run.add_argument(
        "--routing",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra kvgate routing: setting, value parsed as YAML (repeatable)",
    )
    run.add_argument(
        "--predicted", action="store_true", help="kvgate predicts replica caches instead of following KV events"
    )
    run.add_argument(
        "--gateways",
        default="1",
        metavar="G[,G...]",
        help="run kvgate and sglang-router as G instances over the same replicas, requests spread round "
        "robin over them (comma-separated counts run side by side, e.g. 1,3; default: %(default)s)",
    )
    run.add_argument("--users", type=int, help="closed loop with this many users (default: open loop)")
    run.add_argument(
        "--ttft-slo", type=float, default=0.5, help="TTFT bound of goodput, seconds (default: %(default)s)"
    )
    run.add_argument("--trace-dir", type=Path, default=REPO.parent / "shared" / "traces")
    run.add_argument("--trace", choices=sorted(TRACE_FILES), default="conversation")
    run.add_argument("--request-timeout", type=float, default=300.0)
    run.add_argument("--out", type=Path, help="report folder (default: bench/out/WORKLOAD)")
    for name, (_, summary) in {**DELEGATED, **SPAWNED}.items():
        commands.add_parser(name, description=summary, add_help=False)
    return parser


def _command_list() -> str:
    """One line per subcommand, name and summary (argparse's own list wraps names longer than 16 characters)."""
    summaries = {"run": RUN_SUMMARY} | {name: summary for name, (_, summary) in {**DELEGATED, **SPAWNED}.items()}
    width = max(map(len, summaries))
    return "commands:\n" + "\n".join(f"  {name:<{width}}  {summary}" for name, summary in summaries.items())


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if argv[:1] and argv[0] in DELEGATED:
        module_name, _ = DELEGATED[argv[0]]
        command_main: Callable[[list[str]], int | None] = import_module(module_name).main
        return command_main(argv[1:]) or 0
    if argv[:1] and argv[0] in SPAWNED:
        script, _ = SPAWNED[argv[0]]
        return subprocess.run([sys.executable, str(REPO / script), *argv[1:]], check=False).returncode
    args = build_parser().parse_args(argv)
    overrides = pairs(args.set, "--set")
    if args.workload == "trace-replay" and "trace_file" not in overrides:
        trace = args.trace_dir / TRACE_FILES[args.trace]
        if not trace.is_file():
            print(f"skipping trace replay: {trace} not found (pass --trace-dir DIR holding {TRACE_FILES[args.trace]})")
            return 0
        overrides["trace_file"] = str(trace)
    if args.peers and not sglang_router_binary().exists():
        print(sglang_install_hint(), file=sys.stderr)
        return 2
    routing = {key: yaml.safe_load(value) for key, value in pairs(args.routing, "--routing").items()}
    contenders = [
        dataclasses.replace(contender, routing=routing) if contender.kind == "kvgate" else contender
        for contender in contenders_for(
            args.policy.split(","), args.peers, _counts(args.gateways), args.dynamo or [DYNAMO_DEFAULTS]
        )
    ]
    fleet = FleetSpec(
        replicas=len(args.replica_url) or args.replicas,
        num_blocks=args.num_blocks or DEFAULT_NUM_BLOCKS[args.workload],
        block_size=args.block_size,
        engine_args=tuple(sim_cost_args(args.sim_prefill_us * 1e-6) + args.engine_arg),
        kv_events=not args.predicted,
        given_urls=tuple(url.rstrip("/") for url in args.replica_url),
    )
    settings = RunSettings(
        workload=args.workload,
        overrides=overrides,
        contenders=contenders,
        fleet=fleet,
        out_dir=args.out or REPO / "bench" / "out" / args.workload,
        users=args.users,
        ttft_slo_s=args.ttft_slo,
        request_timeout_s=args.request_timeout,
    )
    outcome = run_benchmark(settings)
    print(outcome.markdown)
    print(f"report: {settings.out_dir}/report.md, report.json, hit_rate.png, ttft_cdf.png")
    return 1 if not outcome.rows else 0


def sim_cost_args(prefill_s_per_token: float) -> list[str]:
    """`kvgate engine` flags with the smollm2-cpu cost model compressed to this prefill cost.

    Every constant is scaled by the same factor, so the model's shape (prefill against decode,
    batch and context costs) stays the calibrated one while a run takes minutes, not hours.
    """
    costs = scaled_costs(SIM_PRESETS["smollm2-cpu"], prefill_s_per_token)
    return [
        f"--sim-{field.name.replace('_', '-')}={getattr(costs, field.name):.9g}" for field in dataclasses.fields(costs)
    ]


def scaled_costs(costs: SimCosts, prefill_s_per_token: float) -> SimCosts:
    """``costs`` with every constant scaled by one factor, so that prefill costs ``prefill_s_per_token``."""
    scale = prefill_s_per_token / costs.prefill_per_token_s
    return SimCosts(**{field.name: getattr(costs, field.name) * scale for field in dataclasses.fields(costs)})


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """Unwind like Ctrl-C, so the replicas and routers this run started are stopped too."""
    raise SystemExit(128 + signum)


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise SystemExit(f"--gateways expects counts like 1,3, got {text!r}") from None
    if any(count < 1 for count in counts):
        raise SystemExit(f"--gateways counts must be at least 1, got {text!r}")
    return counts


def pairs(items: list[str], flag: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"{flag} expects KEY=VALUE, got {item!r}")
        pairs[key.strip()] = value.strip()
    return pairs
