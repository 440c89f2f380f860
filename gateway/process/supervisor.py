"""`kvgate up`: start the engines a config lists, then the gateway; stop them all together.

Engines run as child processes that die with the supervisor (Linux parent-death signal), so
neither Ctrl-C, SIGTERM nor a crash of the supervisor leaves an orphan replica holding memory.
"""

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path

import aiohttp

from gateway.config import EngineSpec, KvgateConfig, engine_name
from gateway.process.server import add_config_flags, add_workers_flag, load_command_config, serve_gateway
from gateway.process.workers.parent import die_with_parent
from gateway.routing.pd_decider import fleet_disaggregates

log = logging.getLogger("kvgate.up")

ENGINE_READY_TIMEOUT_S = 600.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvgate up",
        description="Start the bundled engines listed under `engines:` and the gateway in front of them.",
    )
    add_config_flags(parser)
    add_workers_flag(parser)
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    config = load_command_config(args)
    if config is None:
        return 2
    return asyncio.run(run_deployment(config, Path(args.config), args.workers, args.log_level))


KV_CONNECTOR = '{"kv_role": "kv_both"}'
"""The bundled engine's KV connector, as vLLM's NixlConnector is configured: every engine of a fleet
with P/D roles gets it, since a ``both`` replica may serve either leg of a split request."""


def engine_command(config: KvgateConfig, engine: EngineSpec) -> list[str]:
    model = engine.model or config.model
    command = [sys.executable, "-m", "gateway.process.cli", "engine", "--host", engine.host, "--port", str(engine.port)]
    command += ["--model", model, "--block-size", str(config.block_size)]
    if engine.kv_events_port:
        command += ["--kv-events", f"tcp://{engine.host}:{engine.kv_events_port}"]
        if engine.kv_events_replay_port:
            command += ["--kv-events-replay", f"tcp://{engine.host}:{engine.kv_events_replay_port}"]
    if engine.load_events_port:
        command += ["--load-events", f"tcp://{engine.host}:{engine.load_events_port}"]
    disaggregated = fleet_disaggregates((other.role for other in config.engines), config.routing.disaggregation)
    if disaggregated and "--kv-transfer-config" not in engine.args:
        command += ["--kv-transfer-config", KV_CONNECTOR]
    return command + engine.args


async def run_deployment(
    config: KvgateConfig, config_path: Path, workers: int | None = None, log_level: str = "info"
) -> int:
    children: list[asyncio.subprocess.Process] = []
    try:
        for index, engine in enumerate(config.engines):
            command = engine_command(config, engine)
            log.info("starting %s: %s", engine_name(index, engine), " ".join(command))
            children.append(await asyncio.create_subprocess_exec(*command, preexec_fn=die_with_parent))
        await asyncio.gather(
            *(_wait_ready(engine, child) for engine, child in zip(config.engines, children, strict=True))
        )
        return await serve_gateway(config, config_path, workers, log_level)
    except EngineFailedError as exc:
        print(f"kvgate up: {exc}", file=sys.stderr)
        return 1
    finally:
        await _stop_all(children)


class EngineFailedError(RuntimeError):
    """An engine exited or never became ready."""


async def _wait_ready(engine: EngineSpec, child: asyncio.subprocess.Process) -> None:
    url = f"http://{engine.host}:{engine.port}/health"
    deadline = time.monotonic() + ENGINE_READY_TIMEOUT_S
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if child.returncode is not None:
                raise EngineFailedError(f"engine on port {engine.port} exited with status {child.returncode}")
            try:
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as response:
                    if response.status == 200:
                        log.info("engine on port %d is ready", engine.port)
                        return
            except (TimeoutError, aiohttp.ClientError):
                pass
            await asyncio.sleep(0.5)
    raise EngineFailedError(f"engine on port {engine.port} not ready after {ENGINE_READY_TIMEOUT_S:.0f}s")


async def _stop_all(children: list[asyncio.subprocess.Process], grace_s: float = 15.0) -> None:
    running = [child for child in children if child.returncode is None]
    for child in running:
        child.terminate()
    try:
        await asyncio.wait_for(asyncio.gather(*(child.wait() for child in running)), grace_s)
    except TimeoutError:
        for child in running:
            if child.returncode is None:
                child.kill()
        await asyncio.gather(*(child.wait() for child in running))
