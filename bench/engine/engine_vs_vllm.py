"""kvgate's bundled engine against vLLM on CPU: same model, same dtype, one server at a time.

Each server is started alone, warmed up with one short request, then measured over HTTP with
streaming: TTFT of a cold ``--prompt-tokens`` prompt and of one sharing its first
``--cached-tokens`` tokens (a multiple of vLLM's 128-token CPU block), decode tokens/s of a single
request, and output tokens/s with ``--concurrency`` requests at once (``--output-tokens`` each,
EOS ignored). The 1-minute load average is recorded before each measurement, since the machine
may be shared; ``--rounds`` alternates the servers several times and reports, per measure, the
median round. Prints a table and saves every round as JSON under ``bench/out/engine-vs-vllm/``.

    python -m bench.engine.engine_vs_vllm [--dtype float32] [--rounds 3] [--trials 3] [--concurrency 4 16] [--skip-vllm]
"""

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from bench.engine.engine_process import start_engine
from bench.engine.prefix_ttft import trial_requests
from bench.harness.loadgen import RequestResult, Target, run_load
from bench.harness.processes import REPO, Process
from bench.peers.vllm_peer import VllmOptions, require_vllm, running_vllm, vllm_options_on_free_ports
from bench.workloads.types import BenchRequest

MODEL = "smollm2-135m"
OUT_DIR = REPO / "bench" / "out" / "engine-vs-vllm"


@dataclass
class Measurement:
    name: str
    value: float
    unit: str
    higher_is_better: bool
    load_avg_1m: float
    detail: str = ""


@dataclass
class Settings:
    dtype: str
    trials: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    concurrency: list[int]
    concurrent_prompt_tokens: int
    kv_cache_gib: int
    max_num_seqs: int
    max_num_batched_tokens: int


def load_avg() -> float:
    return os.getloadavg()[0]


def random_prompts(count: int, length: int, seed: int) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    return [tuple(rng.randrange(1000, 40000) for _ in range(length)) for _ in range(count)]


def checked(results: list[RequestResult], what: str) -> list[RequestResult]:
    failed = [result for result in results if not result.ok]
    if failed:
        raise RuntimeError(f"{what}: {len(failed)} requests failed: {failed[0].error or failed[0].status}")
    return results


def send_all(
    target: Target, requests: list[BenchRequest], users: int | None, what: str
) -> tuple[list[RequestResult], float]:
    load = asyncio.run(run_load(requests, target, users=users, label=what))
    return checked(load.results, what), load.duration_s


def measure_prefix_ttft(target: Target, settings: Settings) -> list[Measurement]:
    """Cold TTFT, then TTFT of a prompt sharing ``cached_tokens`` with it, medians over trials."""
    requests = [
        request
        for trial in range(settings.trials)
        for request in trial_requests(1000 + trial, settings.prompt_tokens, settings.cached_tokens, 4)
    ]
    load = load_avg()
    results, _ = send_all(target, requests, 1, "prefix-ttft")
    cold = [result for result in results if result.group == "cold"]
    warm = [result for result in results if result.group == "warm"]
    return [
        Measurement(
            f"cold TTFT, {settings.prompt_tokens}-token prompt",
            statistics.median(r.ttft for r in cold),
            "s",
            False,
            load,
        ),
        Measurement(
            f"TTFT, {settings.cached_tokens} of {settings.prompt_tokens} tokens cached",
            statistics.median(r.ttft for r in warm),
            "s",
            False,
            load,
            f"cached_tokens reported: {[r.cached_tokens for r in warm]}",
        ),
    ]


def measure_decode(target: Target, settings: Settings) -> Measurement:
    """Tokens/s after the first token of one request alone, median over trials."""
    prompts = random_prompts(settings.trials, 32, seed=2)
    requests = [
        BenchRequest(f"decode-{i}", f"decode-{i}", 0.0, settings.output_tokens, prompt)
        for i, prompt in enumerate(prompts)
    ]
    load = load_avg()
    results, _ = send_all(target, requests, 1, "decode")
    rates = [(result.output_tokens - 1) / (result.e2e - result.ttft) for result in results]
    return Measurement("decode, one request", statistics.median(rates), "tokens/s", True, load)


def measure_concurrency(target: Target, settings: Settings, concurrency: int) -> Measurement:
    """Output tokens/s of ``concurrency`` requests sent at once."""
    prompts = random_prompts(concurrency, settings.concurrent_prompt_tokens, seed=concurrency)
    requests = [BenchRequest(f"c{i}", f"c{i}", 0.0, settings.output_tokens, prompt) for i, prompt in enumerate(prompts)]
    load = load_avg()
    results, duration = send_all(target, requests, None, f"concurrency-{concurrency}")
    ttft = statistics.median(result.ttft for result in results)
    return Measurement(
        f"output tokens/s, {concurrency} concurrent",
        sum(result.output_tokens for result in results) / duration,
        "tokens/s",
        True,
        load,
        f"TTFT p50 {ttft:.2f} s, {duration:.1f} s in all",
    )


def measure_server(url: str, settings: Settings) -> list[Measurement]:
    target = Target((url,), MODEL)
    send_all(target, [BenchRequest("warm-up", "warm-up", 0.0, 8, random_prompts(1, 64, seed=1)[0])], 1, "warm-up")
    return [
        *measure_prefix_ttft(target, settings),
        measure_decode(target, settings),
        *(measure_concurrency(target, settings, concurrency) for concurrency in settings.concurrency),
    ]


@contextmanager
def kvgate_server(settings: Settings, log_dir: Path) -> Iterator[Process]:
    flags = [
        "--model", MODEL, "--dtype", settings.dtype, "--max-model-len", "4096",
        "--kv-cache-gib", str(settings.kv_cache_gib), "--max-num-seqs", str(settings.max_num_seqs),
        "--max-num-batched-tokens", str(settings.max_num_batched_tokens), "--log-level", "WARNING",
    ]  # fmt: skip
    engine = start_engine(log_dir, *flags)
    try:
        yield engine
    finally:
        engine.stop()


def vllm_server(settings: Settings, log_dir: Path) -> AbstractContextManager[Process]:
    options = VllmOptions(
        dtype=settings.dtype,
        kv_cache_gib=settings.kv_cache_gib,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
    )
    return running_vllm(vllm_options_on_free_ports(options, with_kv_events=False), log_dir)


def median_round(rounds: list[list[Measurement]]) -> list[Measurement]:
    """Per measure, the measurement of the median round (of an even count, the better middle one)."""
    medians = []
    for row in zip(*rounds, strict=False):
        best_first = sorted(row, key=lambda m: m.value, reverse=row[0].higher_is_better)
        medians.append(best_first[(len(row) - 1) // 2])
    return medians


def print_table(by_contender: dict[str, list[Measurement]]) -> None:
    """One row per measure, one column per contender; with two, how many times better the first is."""
    names = list(by_contender)
    advantage = len(names) == 2
    print(
        f"{'measure':<42}" + "".join(f"{name:>30}" for name in names) + (f"  {names[0]} better by" if advantage else "")
    )
    for row in zip(*by_contender.values(), strict=False):
        cells = "".join(f"{f'{m.value:.3f} {m.unit} (load {m.load_avg_1m:.1f})':>30}" for m in row)
        ratio = ""
        if advantage:
            first, second = row
            ratio = f"  {first.value / second.value if first.higher_is_better else second.value / first.value:.2f}x"
        print(f"{row[0].name:<42}{cells}{ratio}")
    for name, measurements in by_contender.items():
        for m in measurements:
            if m.detail:
                print(f"  {name}, {m.name}: {m.detail}")


def print_rounds(rounds: dict[str, list[list[Measurement]]]) -> None:
    for name, runs in rounds.items():
        for row in zip(*runs, strict=False):
            values = ", ".join(f"{m.value:.3f} (load {m.load_avg_1m:.1f})" for m in row)
            print(f"  {name}, {row[0].name}, every round: {values}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument(
        "--rounds", type=int, default=1, help="start each server this many times, alternating; the median round counts"
    )
    parser.add_argument("--prompt-tokens", type=int, default=1536)
    parser.add_argument(
        "--cached-tokens", type=int, default=1408, help="shared prefix; a multiple of 128 counts fully for vLLM"
    )
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--concurrent-prompt-tokens", type=int, default=128)
    parser.add_argument("--kv-cache-gib", type=int, default=1)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    contenders = parser.add_mutually_exclusive_group()
    contenders.add_argument("--skip-vllm", action="store_true")
    contenders.add_argument("--skip-kvgate", action="store_true")
    args = parser.parse_args(argv)
    settings = Settings(
        **{name: value for name, value in vars(args).items() if name not in ("skip_vllm", "skip_kvgate", "rounds")}
    )
    servers: dict[str, Callable[[Settings, Path], AbstractContextManager[Process]]] = {}
    if not args.skip_kvgate:
        servers["kvgate engine"] = kvgate_server
    if not args.skip_vllm:
        require_vllm(VllmOptions())
        servers["vLLM (CPU)"] = vllm_server
    rounds: dict[str, list[list[Measurement]]] = {name: [] for name in servers}
    with tempfile.TemporaryDirectory() as log_dir:
        for round_number in range(1, args.rounds + 1):
            for name, server in servers.items():
                print(f"round {round_number}, {name}: starting (load average {load_avg():.1f})")
                with server(settings, Path(log_dir)) as process:
                    rounds[name].append(measure_server(process.url, settings))
    print_table({name: median_round(measured) for name, measured in rounds.items()})
    if args.rounds > 1:
        print_rounds(rounds)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    out = OUT_DIR / f"{time.strftime('%Y%m%d-%H%M%S')}-{settings.dtype}.json"
    document = {
        "settings": asdict(settings),
        "rounds": {name: [[asdict(m) for m in measured] for measured in runs] for name, runs in rounds.items()},
    }
    out.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
