"""`kvgate gateway -c FILE`: serve the gateway in front of the config's backends.

With ``--workers N`` (or ``workers: N``) this process is the parent of N worker processes that
share the port (gateway/process/workers/); each worker runs ``serve`` with its identity.
"""

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from aiohttp import web

from gateway.config import ConfigError, KvgateConfig, load_config
from gateway.process import event_loop
from gateway.process.background_threads import install_background_executor
from gateway.process.http_server import LINGERING_S, GatewayRunner
from gateway.process.workers.identity import WorkerIdentity
from gateway.process.workers.parent import run_workers, worker_command
from gateway.process.workers.worker import make_worker, start_private_site
from gateway.wiring.app import create_app, refusal_recorder
from gateway.wiring.reload import reload_on_signal
from protocol.startup_heap import freeze_startup_objects

SHUTDOWN_GRACE_S = 30.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvgate gateway", description="Run the kvgate gateway in front of the backends in a config file."
    )
    add_config_flags(parser)
    parser.add_argument("--host", help="listen address; overrides listen.host in the config")
    parser.add_argument("--port", type=int, help="listen port; overrides listen.port in the config")
    add_workers_flag(parser)
    return parser


def add_workers_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workers", type=_positive_int, help="gateway processes sharing the port (SO_REUSEPORT); overrides `workers:`"
    )


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """The flags every config-driven command shares."""
    parser.add_argument("-c", "--config", default="config.yaml", help="config file (default: %(default)s)")
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log verbosity"
    )


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def load_command_config(args: argparse.Namespace) -> KvgateConfig | None:
    """Set up logging and load ``--config``; None, after saying why on stderr, when it is invalid."""
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        return load_config(args.config)
    except ConfigError as exc:
        print(f"kvgate: {exc}", file=sys.stderr)
        return None


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    config = load_command_config(args)
    if config is None:
        return 2
    if args.host:
        config.listen.host = args.host
    if args.port is not None:
        config.listen.port = args.port
    return event_loop.run(serve_gateway(config, Path(args.config), args.workers, args.log_level))


async def serve_gateway(config: KvgateConfig, config_path: Path, workers: int | None, log_level: str) -> int:
    """One gateway process, or the parent of ``workers`` (else the config's `workers:`) of them."""
    identity = WorkerIdentity.from_env()
    count = workers or config.workers
    if identity is None and count > 1:
        command = worker_command("gateway", "-c", str(config_path), "--log-level", log_level)
        command += ["--host", config.listen.host, "--port", str(config.listen.port)]
        return await run_workers(command, count)
    await serve(config, config_path, identity)
    return 0


async def serve(config: KvgateConfig, config_path: Path | None = None, worker: WorkerIdentity | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then drain in-flight requests for up to SHUTDOWN_GRACE_S.

    SIGHUP reloads ``config_path`` (see gateway/wiring/reload.py). A ``worker`` shares the port with its
    siblings and sums their state in its operator endpoints.
    """
    app = create_app(config, config_path)
    siblings = make_worker(app, worker) if worker is not None else None
    # No aiohttp access log: gateway/observability/request_log.py writes the one structured line per request.
    runner = GatewayRunner(
        app,
        header_timeout_s=config.timeouts.client_headers_s,
        lingering_time=min(LINGERING_S, config.timeouts.client_body_s),
        on_refused=refusal_recorder(app),
        handler_cancellation=True,
        shutdown_timeout=SHUTDOWN_GRACE_S,
        access_log=None,
    )
    await runner.setup()
    install_background_executor(asyncio.get_running_loop())
    freeze_startup_objects()
    private = await start_private_site(app, worker) if worker is not None else None
    site = web.TCPSite(runner, config.listen.host, config.listen.port, reuse_port=worker is not None)
    await site.start()
    role = f" (worker {worker.index} of {worker.count})" if worker is not None else ""
    print(f"kvgate gateway listening on http://{config.listen.host}:{config.listen.port}/v1{role}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload_on_signal, app)
    await stop.wait()
    await runner.cleanup()
    if private is not None and siblings is not None:
        await private.cleanup()
        await siblings.close()
