"""`kvgate epp -c config.yaml [--grpc-port 9002] [--health-port 9003]`: the picker's process.

This module is the picker's composition root (as gateway/wiring/app.py is the HTTP gateway's): it builds
the same ``Gateway`` from the config, then serves the ext_proc service and gRPC health on the
gRPC port, gRPC health alone on the health port (GIE's EPP ports), and the gateway's /metrics,
dashboard and /admin endpoints over HTTP on the metrics port (GIE's is 9090).

With ``--workers N`` (or ``workers: N``) this process is the parent of N pickers sharing the three
ports, as the HTTP gateway's workers share theirs (gateway/process/workers/): the kernel spreads
Envoy's connections over them, tenant limits are counted once for all of them, and each
worker's operator endpoints answer for all. One picker process has one core for its event loop.

Health services, after GIE's docs/proposals/004-endpoint-picker-protocol/README.md: ``liveness``
is SERVING while the process runs; ``readiness``, ``envoy.service.ext_proc.v3.ExternalProcessor``
and the server as a whole ("") are SERVING while at least one replica passes its health checks.
"""

import argparse
import asyncio
import logging
import signal
from contextlib import suppress

import grpc
from aiohttp import web
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import add_ExternalProcessorServicer_to_server
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from gateway.admin.app import admin_app
from gateway.config import KvgateConfig
from gateway.epp.service import EndpointPicker
from gateway.observability.routes import add_routes as add_observability_routes
from gateway.process.background_threads import install_background_executor
from gateway.process.server import add_config_flags, add_workers_flag, load_command_config
from gateway.process.workers.identity import WorkerIdentity
from gateway.process.workers.parent import run_workers, worker_command
from gateway.process.workers.worker import make_worker, start_private_site
from gateway.wiring.app import openai_errors
from gateway.wiring.state import GATEWAY, Gateway
from protocol.startup_heap import freeze_startup_objects

log = logging.getLogger("kvgate.epp")

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
READY_SERVICES = ("", "readiness", EXT_PROC_SERVICE)
READINESS_POLL_S = 0.5
SHUTDOWN_GRACE_S = 10.0
MAX_MESSAGE_BYTES = 16 << 20
"""gRPC's 4 MiB default is below a buffered body the HTTP gateway takes (8 MiB) plus its framing."""
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvgate epp",
        description="Run an Envoy ext_proc endpoint picker (Gateway API Inference Extension) on the config's backends.",
    )
    add_config_flags(parser)
    parser.add_argument("--host", default="0.0.0.0", help="listen address of every port (default: %(default)s)")
    parser.add_argument("--grpc-port", type=int, default=9002, help="ext_proc + gRPC health (default: %(default)s)")
    parser.add_argument("--health-port", type=int, default=9003, help="gRPC health (default: %(default)s)")
    parser.add_argument(
        "--metrics-port", type=int, default=9090, help="HTTP /metrics, /dashboard, /admin (default: %(default)s)"
    )
    parser.add_argument(
        "--fallbacks", type=int, default=0, help="endpoints to name after the pick, best first (default: %(default)s)"
    )
    add_workers_flag(parser)
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    config = load_command_config(args)
    if config is None:
        return 2
    worker = WorkerIdentity.from_env()
    count = args.workers or config.workers
    if worker is None and count > 1:
        # Each worker runs this same command line; its identity in the environment makes it serve.
        return asyncio.run(run_workers(worker_command("epp", *argv), count))
    # asyncio's own loop: grpc.aio supports no other.
    ports = (args.grpc_port, args.health_port, args.metrics_port)
    asyncio.run(serve_epp(config, args.host, *ports, args.fallbacks, worker))
    return 0


async def serve_epp(
    config: KvgateConfig,
    host: str,
    grpc_port: int,
    health_port: int,
    metrics_port: int,
    fallbacks: int,
    worker: WorkerIdentity | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then stop taking streams and finish those in flight. A
    ``worker`` shares its ports with its siblings and sums their state in its operator endpoints."""
    install_background_executor(asyncio.get_running_loop())
    gateway = Gateway.build(config)
    await gateway.start()
    freeze_startup_objects()
    health = HealthServicer()
    await _set_ready(health, False)
    await health.set("liveness", health_pb2.HealthCheckResponse.SERVING)
    # gRPC binds with SO_REUSEPORT unless told not to; a lone picker must fail on a taken port.
    shared = [("grpc.so_reuseport", int(worker is not None))]
    picker = grpc.aio.server(options=GRPC_OPTIONS + shared)
    add_ExternalProcessorServicer_to_server(EndpointPicker(gateway, fallbacks), picker)
    health_pb2_grpc.add_HealthServicer_to_server(health, picker)
    picker.add_insecure_port(f"{host}:{grpc_port}")
    health_only = grpc.aio.server(options=shared)
    health_pb2_grpc.add_HealthServicer_to_server(health, health_only)
    health_only.add_insecure_port(f"{host}:{health_port}")
    app = metrics_app(gateway)
    siblings = make_worker(app, worker) if worker is not None else None
    metrics = web.AppRunner(app, access_log=None)
    await metrics.setup()
    private = await start_private_site(app, worker) if worker is not None else None
    await web.TCPSite(metrics, host, metrics_port, reuse_port=worker is not None).start()
    await picker.start()
    await health_only.start()
    readiness = asyncio.create_task(_follow_readiness(gateway, health))
    role = f" (worker {worker.index} of {worker.count})" if worker is not None else ""
    print(f"kvgate epp: ext_proc on {host}:{grpc_port}, health on {host}:{health_port}{role}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await health.enter_graceful_shutdown()
    readiness.cancel()
    with suppress(asyncio.CancelledError):
        await readiness
    await picker.stop(SHUTDOWN_GRACE_S)
    await health_only.stop(None)
    await metrics.cleanup()
    if private is not None and siblings is not None:
        await private.cleanup()
        await siblings.close()
    await gateway.stop()


def metrics_app(gateway: Gateway) -> web.Application:
    """The HTTP gateway's operator endpoints (/metrics, /dashboard, /admin/backends) on the picker's Gateway."""
    app = web.Application(middlewares=[openai_errors])
    app[GATEWAY] = gateway
    add_observability_routes(app)
    app.add_subapp("/admin", admin_app())
    return app


async def _follow_readiness(gateway: Gateway, health: HealthServicer) -> None:
    ready: bool | None = None
    while True:
        now = any(backend.healthy for backend in gateway.pool.backends.values())
        if now != ready:
            ready = now
            await _set_ready(health, now)
            log.info("epp readiness: %s", "SERVING" if now else "NOT_SERVING")
        await asyncio.sleep(READINESS_POLL_S)


async def _set_ready(health: HealthServicer, ready: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
    for service in READY_SERVICES:
        await health.set(service, status)
