"""``kvgate bench simulate``: ``bench run``'s comparison in virtual time (see bench/sim/simulate.py).

Same workloads, flags, table and plots as ``bench run``, with kvgate's real router and the
engine's real scheduler and block manager, but no processes, sockets or sleeps: a whole trace
over 4 to 256 replicas in minutes, exactly repeatable. Contenders are kvgate's policies, the
client's direct round robin and, with ``--peers``, models of sglang-router's cache_aware, Dynamo's
KV router and llm-d's precise prefix-cache scheduling (``bench/sim/peer_models.py``; ``bench run``
runs the real sglang-router).
"""

import argparse
import dataclasses
import time
from pathlib import Path

import yaml

from bench.cli import DEFAULT_NUM_BLOCKS, TRACE_FILES, pairs, scaled_costs
from bench.harness.bounds import compute_bounds
from bench.harness.contenders import MODEL, contenders_for
from bench.harness.processes import REPO
from bench.harness.report import ContenderRow, summarize, write_report
from bench.harness.runner import bound_prompt
from bench.harness.text_vocab import round_trip_vocab
from bench.harness.users_table import DEFAULT_ITL_SLO_S
from bench.peers.dynamo_config import DYNAMO_DEFAULTS, add_dynamo_argument
from bench.sim.peer_models import modelled_peers
from bench.sim.sim_compare import compare_with_run
from bench.sim.simulate import SimFleet, VirtualFleet
from bench.workloads import WORKLOADS, with_overrides
from engine.sim.sim_presets import GPU_PRESETS, preset_costs, preset_names
from normalize.chat_tokenizer import ChatTokenizer

SIM_WORKLOADS = sorted(name for name, workload in WORKLOADS.items() if not workload.chat)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvgate bench simulate", description=__doc__)
    parser.add_argument("--workload", choices=SIM_WORKLOADS, required=True)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument(
        "--policy", default="all", help="comma-separated kvgate policies, or all (default: %(default)s)"
    )
    parser.add_argument(
        "--num-blocks",
        type=int,
        help="KV blocks per replica (default: a GPU preset's KV capacity, else per workload as bench run)",
    )
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--preset",
        choices=preset_names(),
        default="smollm2-cpu",
        help="sim cost model (default: %(default)s; see engine/sim/sim_presets.py for the GPU ones)",
    )
    parser.add_argument(
        "--sim-prefill-us",
        type=float,
        help="scale every constant of the preset so prefill costs this many microseconds per token "
        "(default: 75 for smollm2-cpu, as bench run; GPU presets unscaled)",
    )
    parser.add_argument("--max-num-seqs", type=int, default=SimFleet.max_num_seqs)
    parser.add_argument("--max-num-batched-tokens", type=int, default=SimFleet.max_num_batched_tokens)
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="workload parameter (repeatable)"
    )
    parser.add_argument(
        "--routing", action="append", default=[], metavar="KEY=VALUE", help="kvgate routing: setting (YAML value)"
    )
    parser.add_argument(
        "--host-kv-blocks", type=int, default=0, help="a host-memory KV tier of this many blocks per replica"
    )
    parser.add_argument(
        "--no-retention-hints", action="store_true", help="send no session keys to the replicas' block managers"
    )
    parser.add_argument(
        "--no-load-reports",
        action="store_true",
        help="replicas publish no load socket: the router sees /stats every 2 s and its own queued prefill",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also the modelled peers: sglang-router cache_aware, Dynamo's KV router, llm-d precise prefix "
        "(bench/sim/peer_models.py)",
    )
    add_dynamo_argument(parser, repeatable=True)
    parser.add_argument("--predicted", action="store_true", help="kvgate predicts caches instead of following events")
    parser.add_argument("--users", type=int, help="closed loop with this many users (default: open loop)")
    parser.add_argument("--ttft-slo", type=float, default=0.5, help="TTFT bound of goodput, seconds")
    parser.add_argument(
        "--itl-slo",
        type=float,
        default=DEFAULT_ITL_SLO_S,
        help="mean inter-token latency bound of goodput, seconds (default: %(default)s)",
    )
    parser.add_argument("--trace-dir", type=Path, default=REPO.parent / "shared" / "traces")
    parser.add_argument("--trace", choices=sorted(TRACE_FILES), default="conversation")
    parser.add_argument("--out", type=Path, help="report folder (default: bench/out/simulate/WORKLOAD)")
    parser.add_argument(
        "--compare-with-run",
        type=Path,
        metavar="REPORT_JSON",
        help="a `bench run` report.json of the same workload: print the simulation beside it (issue 13's check)",
    )
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    overrides = pairs(args.set, "--set")
    if args.workload == "trace-replay" and "trace_file" not in overrides:
        trace = args.trace_dir / TRACE_FILES[args.trace]
        if not trace.is_file():
            print(f"skipping trace replay: {trace} not found (pass --trace-dir DIR holding {TRACE_FILES[args.trace]})")
            return 0
        overrides["trace_file"] = str(trace)
    routing = {key: yaml.safe_load(value) for key, value in pairs(args.routing, "--routing").items()}
    contenders = [
        dataclasses.replace(contender, routing=routing) if contender.kind == "kvgate" else contender
        for contender in contenders_for(args.policy.split(","), peers=False)
    ]
    if args.peers:
        contenders += modelled_peers(args.dynamo or [DYNAMO_DEFAULTS])
    prefill_us = (
        args.sim_prefill_us if args.sim_prefill_us is not None else (75.0 if args.preset == "smollm2-cpu" else None)
    )
    costs = preset_costs(args.preset)
    if prefill_us is not None:
        costs = scaled_costs(costs, prefill_us * 1e-6)
    gpu = GPU_PRESETS.get(args.preset)
    default_blocks = gpu.kv_blocks(args.block_size) if gpu else DEFAULT_NUM_BLOCKS[args.workload]
    fleet = SimFleet(
        replicas=args.replicas,
        num_blocks=args.num_blocks or default_blocks,
        costs=costs,
        block_size=args.block_size,
        kv_events=not args.predicted,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        host_blocks=args.host_kv_blocks,
        retention=not args.no_retention_hints,
        load_reports=not args.no_load_reports,
    )
    tokenizer = ChatTokenizer.load(MODEL)
    workload = WORKLOADS[args.workload]
    params = with_overrides(workload.params_type(), overrides)
    requests = workload.generate(params, round_trip_vocab(tokenizer))
    bounds = compute_bounds(
        [bound_prompt(request, tokenizer) for request in requests], fleet.block_size, fleet.replicas * fleet.num_blocks
    )
    rows: list[ContenderRow] = []
    loads = {}
    for contender in contenders:
        started = time.perf_counter()
        outcome = VirtualFleet(contender, fleet, getattr(params, "seed", 0)).run(requests, args.users)
        loads[contender.name] = outcome.load
        rows.append(summarize(contender.name, outcome.load, outcome.served, args.ttft_slo))
        print(
            f"-- {contender.name}: {rows[-1].hit_rate:.1%} hit rate, TTFT p50 {rows[-1].ttft_p50_s:.3f} s, "
            f"p99 {rows[-1].ttft_p99_s:.3f} s ({time.perf_counter() - started:.1f} s to simulate)",
            flush=True,
        )
        if outcome.held.held:
            held = outcome.held
            print(
                f"   late binding: {held.held} held, {held.released} released to the owner, "
                f"{held.timed_out} timed out, mean wait {held.wait_s_total / held.held:.3f} s",
                flush=True,
            )
    out_dir = args.out or REPO / "bench" / "out" / "simulate" / args.workload
    meta = {
        "mode": "simulate (virtual time)",
        "workload": args.workload,
        "params": dataclasses.asdict(params),
        "fleet": {**dataclasses.asdict(fleet), "preset": args.preset},
        "users": args.users,
        "routing": routing,
        "ttft_slo_s": args.ttft_slo,
        "itl_slo_s": args.itl_slo,
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    title = f"{args.workload} (simulated, {args.preset}), {fleet.replicas} replicas x {fleet.num_blocks} blocks"
    print(write_report(out_dir, title, rows, loads, bounds, args.ttft_slo, {}, meta, args.itl_slo))
    print(f"report: {out_dir}/report.md, report.json, hit_rate.png, ttft_cdf.png")
    if args.compare_with_run is not None:
        print(compare_with_run(args.compare_with_run, rows, loads))
    return 0
