"""lm-evaluation-harness on the bundled SmolLM2 three ways: ``local-completions`` straight at a bundled
engine, the same through the gateway, and lm-eval's own transformers backend (``hf``) on the same
float32 weights. Scores must be equal and per-request loglikelihoods equal within float tolerance.

The tasks are the local ones in ``tests/evals/`` (a multiple-choice loglikelihood task and a
generate_until task on an eight-row jsonl), so nothing is downloaded. The completions runs use
``tokenizer_backend=remote``: lm-eval tokenizes through the target's ``/tokenize``.

    python -m bench.peers.lm_eval_parity [--limit N]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.harness.processes import REPO, Process, free_port, http_ok, kvgate_command, launch, wait_ready
from normalize.model_files import resolve_model, tokenizer_dir

MODEL = "smollm2-135m"
TASKS = ("kvgate_capitals_mc", "kvgate_capitals_gen")
TASK_DIR = REPO / "tests" / "evals"
LOGLIKELIHOOD_TOLERANCE = 1e-3


@dataclass(frozen=True)
class EvalRun:
    """One lm-eval run: its task scores, each loglikelihood request's result, and its wall time."""

    scores: dict[str, dict[str, float]]
    loglikelihoods: list[float]
    seconds: float


def run_lm_eval(model: str, model_args: str, output: Path, limit: int | None = None) -> EvalRun:
    """Run the lm-eval CLI offline on the local tasks and read its results and logged samples."""
    command = [
        str(Path(sys.executable).with_name("lm_eval")),
        *("--model", model, "--model_args", model_args, "--tasks", ",".join(TASKS)),
        *(
            "--include_path",
            str(TASK_DIR),
            "--batch_size",
            "1",
            "--device",
            "cpu",
            "--output_path",
            str(output),
            "--log_samples",
        ),
        *(("--limit", str(limit)) if limit is not None else ()),
    ]
    offline = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(output / "datasets")}
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, env={**os.environ, **offline}, capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"lm_eval exited with {done.returncode}:\n{done.stderr[-4000:]}")
    results = json.loads(next(output.rglob("results_*.json")).read_text())["results"]
    scores = {
        task: {name.split(",")[0]: value for name, value in metrics.items() if "stderr" not in name and "," in name}
        for task, metrics in results.items()
    }
    loglikelihoods = []
    for samples in sorted(output.rglob(f"samples_{TASKS[0]}_*.jsonl")):
        for line in samples.read_text().splitlines():
            sample = json.loads(line)
            loglikelihoods += [float(response[0][0]) for response in sample["resps"]]
    return EvalRun(scores, loglikelihoods, seconds)


def completions_args(base_url: str) -> str:
    return f"model={MODEL},base_url={base_url}/v1/completions,tokenizer_backend=remote,num_concurrent=1,max_retries=1"


def hf_args() -> str:
    files = resolve_model(MODEL)
    return f"pretrained={files.cache_dir / 'hf'},tokenizer={tokenizer_dir(files)},dtype=float32"


def start_cluster(workdir: Path) -> tuple[Process, Process]:
    """A bundled engine on the real model and a gateway in front of it."""
    engine_port, gateway_port = free_port(), free_port()
    engine = launch(
        kvgate_command("engine", "--port", str(engine_port), "--num-blocks", "256", "--max-model-len", "1024"),
        engine_port,
        workdir / "engine.log",
    )
    wait_ready(engine, lambda: http_ok(f"{engine.url}/health"), 300)
    config = {"listen": {"port": gateway_port}, "model": MODEL, "backends": [{"name": "e0", "url": engine.url}]}
    config_path = workdir / "gateway.yaml"
    config_path.write_text(yaml.safe_dump(config))
    gateway = launch(kvgate_command("gateway", "-c", str(config_path)), gateway_port, workdir / "gateway.log")
    wait_ready(gateway, lambda: http_ok(f"{gateway.url}/health"), 120)
    return engine, gateway


def compare(limit: int | None, workdir: Path) -> dict[str, Any]:
    """The three runs' scores, times and largest loglikelihood differences."""
    engine, gateway = start_cluster(workdir)
    try:
        direct = run_lm_eval("local-completions", completions_args(engine.url), workdir / "direct", limit)
        routed = run_lm_eval("local-completions", completions_args(gateway.url), workdir / "gateway", limit)
    finally:
        gateway.stop()
        engine.stop()
    reference = run_lm_eval("hf", hf_args(), workdir / "hf", limit)
    return {
        "scores": {"direct": direct.scores, "gateway": routed.scores, "transformers": reference.scores},
        "seconds": {"direct": direct.seconds, "gateway": routed.seconds, "transformers": reference.seconds},
        "loglikelihood_requests": len(direct.loglikelihoods),
        "max_abs_diff_gateway_vs_direct": _max_diff(routed.loglikelihoods, direct.loglikelihoods),
        "max_abs_diff_direct_vs_transformers": _max_diff(direct.loglikelihoods, reference.loglikelihoods),
    }


def _max_diff(left: list[float], right: list[float]) -> float:
    assert len(left) == len(right) and left, "the runs scored different requests"
    return max(abs(a - b) for a, b in zip(left, right, strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=None, help="documents per task (default: all eight)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lm-eval-parity-") as workdir:
        report = compare(args.limit, Path(workdir))
    print(json.dumps(report, indent=2))
    same = report["scores"]["direct"] == report["scores"]["gateway"] == report["scores"]["transformers"]
    close = report["max_abs_diff_direct_vs_transformers"] <= LOGLIKELIHOOD_TOLERANCE
    return 0 if same and close and report["max_abs_diff_gateway_vs_direct"] <= LOGLIKELIHOOD_TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
