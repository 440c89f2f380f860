"""Start a bundled engine replica for an engine benchmark and wait until it serves."""

from pathlib import Path

from bench.harness.processes import Process, free_port, http_ok, kvgate_command, launch, wait_ready


def start_engine(log_dir: Path, *flags: str, timeout_s: float = 180.0) -> Process:
    port = free_port()
    process = launch(kvgate_command("engine", "--port", str(port), *flags), port, log_dir / f"engine-{port}.log")
    wait_ready(process, lambda: http_ok(f"{process.url}/health"), timeout_s)
    return process
