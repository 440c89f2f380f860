"""One benchmark run: generate the workload, compute the bounds, then each contender on fresh replicas."""

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from bench.harness.bounds import Bounds, compute_bounds
from bench.harness.contenders import MODEL, Contender, FleetSpec, deploy
from bench.harness.loadgen import LoadResult, run_load
from bench.harness.replica_stats import requests_served
from bench.harness.report import ContenderRow, summarize, write_report
from bench.harness.text_vocab import round_trip_vocab
from bench.workloads import WORKLOADS, with_overrides
from bench.workloads.types import BenchRequest
from normalize.chat_tokenizer import ChatTokenizer


@dataclass(frozen=True)
class RunSettings:
    workload: str
    overrides: dict[str, str]
    contenders: list[Contender]
    fleet: FleetSpec
    out_dir: Path
    users: int | None = None
    """Closed loop with this many users; None is open loop at the workload's arrival times."""
    ttft_slo_s: float = 1.0
    request_timeout_s: float = 300.0


@dataclass
class RunOutcome:
    rows: list[ContenderRow]
    bounds: Bounds
    markdown: str
    failures: dict[str, str]
    """Contenders that could not run, with why."""


def run_benchmark(settings: RunSettings) -> RunOutcome:
    tokenizer = ChatTokenizer.load(MODEL)
    workload = WORKLOADS[settings.workload]
    params = with_overrides(workload.params_type(), settings.overrides)
    requests = workload.generate(params, round_trip_vocab(tokenizer))
    bounds = compute_bounds(
        [bound_prompt(request, tokenizer) for request in requests],
        settings.fleet.block_size,
        settings.fleet.replicas * settings.fleet.num_blocks,
    )
    rows: list[ContenderRow] = []
    loads: dict[str, LoadResult] = {}
    failures: dict[str, str] = {}
    for contender in settings.contenders:
        print(f"-- {contender.name}", flush=True)
        try:
            with deploy(
                contender, settings.fleet, settings.out_dir / _slug(contender.name), tokenizer.decode
            ) as deployment:
                load = asyncio.run(
                    run_load(requests, deployment.target, settings.users, settings.request_timeout_s, contender.name)
                )
                served = requests_served(deployment.replica_urls)
        except (RuntimeError, TimeoutError, FileNotFoundError, OSError) as exc:
            failures[contender.name] = str(exc).strip().splitlines()[-1]
            print(f"-- {contender.name}: could not run: {exc}", flush=True)
            continue
        loads[contender.name] = load
        rows.append(summarize(contender.name, load, served, settings.ttft_slo_s))
        print(
            f"-- {contender.name}: {rows[-1].hit_rate:.1%} hit rate, TTFT p99 {rows[-1].ttft_p99_s:.3f} s", flush=True
        )
    meta = {
        "workload": settings.workload,
        "params": dataclasses.asdict(params),
        "fleet": dataclasses.asdict(settings.fleet),
        "users": settings.users,
        "ttft_slo_s": settings.ttft_slo_s,
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    title = f"{settings.workload}, {settings.fleet.replicas} replicas x {settings.fleet.num_blocks} blocks"
    markdown = write_report(settings.out_dir, title, rows, loads, bounds, settings.ttft_slo_s, failures, meta)
    return RunOutcome(rows, bounds, markdown, failures)


def bound_prompt(request: BenchRequest, tokenizer: ChatTokenizer) -> tuple[int, ...] | list[int]:
    """The tokens an ideally normalizing system would compute for this request."""
    if request.prompt_ids is not None:
        return request.prompt_ids
    messages = request.canonical_messages or request.messages
    assert messages is not None
    return tokenizer.encode_chat(list(messages))


def _slug(name: str) -> str:
    return name.replace(" ", "-").replace("/", "-")
