"""Where a replica's load reports come from: its load socket (bundled engine), its /stats, or
its Prometheus /metrics (vLLM, SGLang), each turned into one ``ReplicaLoad``.

The HTTP reads send the replica's upstream headers (API key, extra headers), as proxied
requests do: a remote upstream may require them on every path."""

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import zmq
import zmq.asyncio
from prometheus_client.parser import text_string_to_metric_families

from gateway.backends.load_view import LoadView
from protocol.replica_stats import ReplicaLoad, ReplicaStats, decode_load, decode_stats

log = logging.getLogger("kvgate.backends")


@dataclass(frozen=True)
class LoadGauges:
    """An engine's Prometheus gauges for its running and waiting requests and its KV usage (0-1)."""

    running: str
    waiting: str
    kv_usage: tuple[str, ...]
    """The first of these names the engine exports (releases renamed it)."""


VLLM = LoadGauges(
    "vllm:num_requests_running", "vllm:num_requests_waiting", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
)
SGLANG = LoadGauges("sglang:num_running_reqs", "sglang:num_queue_reqs", ("sglang:token_usage",))
"""SGLang's scheduler gauges (``--enable-metrics``; python/sglang/srt/metrics/collector.py and
docs/references/production_metrics.md in sgl-project/sglang): ``token_usage`` is the share of its
KV token pool in use."""
ENGINES = (VLLM, SGLANG)
COUNTED = frozenset(name for engine in ENGINES for name in (engine.running, engine.waiting))
"""Request counts: summed over label sets (vLLM's data-parallel engines, SGLang's data-parallel schedulers)."""
HIGHEST = frozenset({name for engine in ENGINES for name in engine.kv_usage} | {"process_start_time_seconds"})
"""KV usage and prometheus_client's ``process_start_time_seconds`` (where the registry has one: vLLM
with one API server; neither engine in Prometheus multiprocess mode): the highest over label sets."""


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


async def read_metrics_load(
    session: aiohttp.ClientSession, url: str, timeout: aiohttp.ClientTimeout, headers: dict[str, str]
) -> ReplicaLoad | None:
    """Running and waiting requests and KV usage from a vLLM or SGLang /metrics, or None when it
    exports neither engine's gauges."""
    body = await _get(session, f"{url}/metrics", timeout, headers)
    if body is None:
        return None
    try:
        samples = _gauges(body.decode(errors="replace"))
    except ValueError:
        return None
    engine = next((engine for engine in ENGINES if engine.running in samples and engine.waiting in samples), None)
    if engine is None:
        return None
    return ReplicaLoad(
        ts=time.time(),
        running=int(samples[engine.running]),
        waiting=int(samples[engine.waiting]),
        kv_cache_usage=next((samples[name] for name in engine.kv_usage if name in samples), None),
        started_at=samples.get("process_start_time_seconds"),
    )


def _gauges(text: str) -> dict[str, float]:
    """The load gauges over their label sets (data-parallel ranks, models): request counts summed,
    KV usage and the start time the highest."""
    gauges: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name in COUNTED:
                gauges[name] = gauges.get(name, 0.0) + sample.value
            elif name in HIGHEST:
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
