"""What one request costs the engine server: TTFT, and the server's page faults and CPU time.

Starts ``kvgate engine`` (bfloat16 by default), then sends, one at a time, ``--trials`` pairs of a
cold ``--prompt-tokens`` prompt and one sharing its first ``--cached-tokens`` tokens. For each
request it prints the client's TTFT, the engine's own TTFT (arrival to first token, from its
``vllm:time_to_first_token_seconds`` histogram), and the server process's minor page faults and
user/system CPU time (``/proc/PID/stat``) over the request. On a shared machine wall times move
with the load; fault counts do not, and CPU times move far less, so they make the robust A/B.

    python -m bench.engine.request_cost [--trials 3] [--engine-flags "--dtype bfloat16 --threads 1"]

Found with it (``bench/VLLM.md``): 47-60k page faults per cold 1,536-token request before the
engine used one malloc arena, ~14 after.
"""

import argparse
import asyncio
import os
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from bench.engine.engine_process import start_engine
from bench.engine.prefix_ttft import MODEL, trial_requests
from bench.harness.loadgen import Target, run_load

TTFT_SUM = "vllm:time_to_first_token_seconds_sum"


@dataclass
class ProcessUsage:
    minor_faults: int
    user_s: float
    system_s: float


def process_usage(pid: int) -> ProcessUsage:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return ProcessUsage(int(fields[7]), int(fields[11]) / tick, int(fields[12]) / tick)


def engine_ttft_sum(url: str) -> float:
    """The engine's summed TTFT over every request so far (its histogram's ``_sum``)."""
    with urllib.request.urlopen(f"{url}/metrics") as response:
        for line in response.read().decode().splitlines():
            if line.startswith(TTFT_SUM):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=1536)
    parser.add_argument("--cached-tokens", type=int, default=1408)
    parser.add_argument("--engine-flags", default="--dtype bfloat16", help="extra flags for kvgate engine (quoted)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as log_dir:
        engine = start_engine(
            Path(log_dir),
            "--model",
            MODEL,
            "--max-model-len",
            "4096",
            "--log-level",
            "WARNING",
            *args.engine_flags.split(),
        )
        try:
            target = Target((engine.url,), MODEL)
            warm_up = trial_requests(-1, 32, 16, 4)[:1]
            asyncio.run(run_load(warm_up, target, users=1, label="warm-up"))
            print(f"load average {os.getloadavg()[0]:.1f}")
            for trial in range(args.trials):
                for request in trial_requests(1000 + trial, args.prompt_tokens, args.cached_tokens, 4):
                    ttft_before, usage_before = engine_ttft_sum(engine.url), process_usage(engine.proc.pid)
                    result = asyncio.run(run_load([request], target, users=1, label=request.group)).results[0]
                    usage = process_usage(engine.proc.pid)
                    engine_ttft = engine_ttft_sum(engine.url) - ttft_before
                    print(
                        f"{request.group:5s} TTFT client {(result.ttft_s or float('nan')) * 1e3:7.1f} ms,"
                        f" engine {engine_ttft * 1e3:7.1f} ms; cached {result.cached_tokens};"
                        f" server: {usage.minor_faults - usage_before.minor_faults} minor faults,"
                        f" user {(usage.user_s - usage_before.user_s) * 1e3:.0f} ms,"
                        f" system {(usage.system_s - usage_before.system_s) * 1e3:.0f} ms"
                    )
            print(f"load average {os.getloadavg()[0]:.1f}")
        finally:
            engine.stop()


if __name__ == "__main__":
    main()
