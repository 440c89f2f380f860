"""`kvgate gateway -c FILE`: serve the gateway in front of the config's backends."""

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from aiohttp import web

from gateway.app import create_app
from gateway.config import ConfigError, KvgateConfig, load_config
from gateway.http_server import GatewayRunner
from gateway.reload import reload_on_signal

SHUTDOWN_GRACE_S = 30.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvgate gateway", description="Run the kvgate gateway in front of the backends in a config file."
    )
    add_config_flags(parser)
    parser.add_argument("--host", help="listen address; overrides listen.host in the config")
    parser.add_argument("--port", type=int, help="listen port; overrides listen.port in the config")
    return parser


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """The flags every config-driven command shares."""
    parser.add_argument("-c", "--config", default="config.yaml", help="config file (default: %(default)s)")
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log verbosity"
    )


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
    asyncio.run(serve(config, Path(args.config)))
    return 0


async def serve(config: KvgateConfig, config_path: Path | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then drain in-flight requests for up to SHUTDOWN_GRACE_S.

    SIGHUP reloads ``config_path`` (see gateway/reload.py).
    """
    app = create_app(config, config_path)
    # No aiohttp access log: gateway/observability/request_log.py writes the one structured line per request.
    runner = GatewayRunner(
        app,
        header_timeout_s=config.timeouts.client_headers_s,
        handler_cancellation=True,
        shutdown_timeout=SHUTDOWN_GRACE_S,
        access_log=None,
    )
    await runner.setup()
    site = web.TCPSite(runner, config.listen.host, config.listen.port)
    await site.start()
    print(f"kvgate gateway listening on http://{config.listen.host}:{config.listen.port}/v1", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload_on_signal, app)
    await stop.wait()
    await runner.cleanup()
