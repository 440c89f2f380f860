"""Where a replica's load reports come from: its load socket (bundled engine), its /stats, or
its Prometheus /metrics (vLLM), each turned into one ``ReplicaLoad``.

The HTTP reads send the replica's upstream headers (API key, extra headers), as proxied
requests do: a remote upstream may require them on every path."""

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp
import zmq
import zmq.asyncio
from prometheus_client.parser import text_string_to_metric_families

from gateway.backends.load_view import LoadView
from protocol.replica_stats import ReplicaLoad, ReplicaStats, decode_load, decode_stats

log = logging.getLogger("kvgate.backends")

VLLM_RUNNING = "vllm:num_requests_running"
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
"""vLLM's KV usage gauge: the first name in current releases, the second in older ones."""
PROCESS_START = "process_start_time_seconds"
"""prometheus_client's process collector: the server's start time, where its registry has one
(vLLM with one API server; not in Prometheus multiprocess mode)."""


class LoadFeed:
    """An asyncio task that reads a replica's load socket (ZMQ SUB) into its view, every message in order
    (each carries the prompts queued since the one before)."""

    def __init__(
        self, endpoint: str, view: LoadView, on_pending: Callable[[list[list[bytes]]], None] = lambda chains: None
    ) -> None:
        self.endpoint = endpoint
        self.view = view
        self.on_pending = on_pending
        """Takes each report's ``pending_prefixes`` (blocks the replica is about to cache)."""
        self.received = 0
        self.bad_messages = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        socket = zmq.asyncio.Context.instance().socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.connect(self.endpoint)
        self._task = asyncio.get_running_loop().create_task(self._read(socket), name=f"load {self.endpoint}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _read(self, socket: zmq.asyncio.Socket) -> None:
        try:
            while True:
                await asyncio.sleep(0)  # a queued message's recv does not give the loop back
                payload = await socket.recv()
                try:
                    report = decode_load(payload)
                except ValueError:
                    self.bad_messages += 1
                    continue
                self.received += 1
                self.view.on_report(report)
                if report.pending_prefixes:
                    self.on_pending(report.pending_prefixes)
        finally:
            socket.close()


async def read_stats(
    session: aiohttp.ClientSession, url: str, timeout: aiohttp.ClientTimeout, headers: dict[str, str]
) -> ReplicaStats | None:
    """The bundled engine's GET /stats, or None (other engines have none; that is fine)."""
    body = await _get(session, f"{url}/stats", timeout, headers)
    if body is None:
        return None
    try:
        return decode_stats(body)
    except ValueError:
        return None


async def read_vllm_load(
    session: aiohttp.ClientSession, url: str, timeout: aiohttp.ClientTimeout, headers: dict[str, str]
) -> ReplicaLoad | None:
    """Running and waiting requests and KV usage from vLLM's /metrics, or None when it exports none."""
    body = await _get(session, f"{url}/metrics", timeout, headers)
    if body is None:
        return None
    try:
        samples = _gauges(body.decode(errors="replace"))
    except ValueError:
        return None
    if VLLM_RUNNING not in samples or VLLM_WAITING not in samples:
        return None
    usage = next((samples[name] for name in VLLM_KV_USAGE if name in samples), None)
    return ReplicaLoad(
        ts=time.time(),
        running=int(samples[VLLM_RUNNING]),
        waiting=int(samples[VLLM_WAITING]),
        kv_cache_usage=usage,
        started_at=samples.get(PROCESS_START),
    )


def _gauges(text: str) -> dict[str, float]:
    """vLLM's load gauges over their label sets (data-parallel ranks, models): request counts
    summed, KV usage (and the start time) the highest."""
    gauges: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name in (VLLM_RUNNING, VLLM_WAITING):
                gauges[name] = gauges.get(name, 0.0) + sample.value
            elif name in VLLM_KV_USAGE or name == PROCESS_START:
                gauges[name] = max(gauges.get(name, 0.0), sample.value)
    return gauges


async def _get(
    session: aiohttp.ClientSession, url: str, timeout: aiohttp.ClientTimeout, headers: dict[str, str]
) -> bytes | None:
    try:
        async with session.get(url, timeout=timeout, headers=headers) as response:
            return await response.read() if response.status == 200 else None
    except (TimeoutError, aiohttp.ClientError):
        return None
