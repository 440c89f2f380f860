"""A vLLM or SGLang backend's load comes from its Prometheus /metrics at each health check."""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
from aiohttp import web

from gateway.backends.pool import BackendPool
from gateway.config import BackendSpec, HealthConfig
from tests.procs import free_port

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
"""

SGLANG_METRICS = """\
# HELP sglang:num_running_reqs The number of running requests
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",model_name="m",tp_rank="0"} 6.0
sglang:num_running_reqs{dp_rank="1",model_name="m",tp_rank="0"} 1.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0",model_name="m",tp_rank="0"} 2.0
sglang:num_queue_reqs{dp_rank="1",model_name="m",tp_rank="0"} 0.0
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",model_name="m",tp_rank="0"} 0.75
sglang:token_usage{dp_rank="1",model_name="m",tp_rank="0"} 0.125
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{dp_rank="0",model_name="m",tp_rank="0"} 8.128902e+06
"""
"""SGLang's scheduler gauges as its docs/references/production_metrics.md shows them, from two
data-parallel schedulers (each exports its own series)."""


async def health(request: web.Request) -> web.Response:
    return web.Response(text="")


async def metrics(request: web.Request) -> web.Response:
    return web.Response(text=VLLM_METRICS, content_type="text/plain")


@asynccontextmanager
async def metrics_pool(
    metrics_handler: Callable[[web.Request], Awaitable[web.Response]],
) -> AsyncIterator[BackendPool]:
    """A pool with one backend, "replica", served on loopback by ``metrics_handler`` for /metrics."""
    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics_handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield BackendPool.from_specs(
            [(BackendSpec(name="replica", url=f"http://127.0.0.1:{port}"), "m")], HealthConfig()
        )
    finally:
        await runner.cleanup()


def test_vllm_metrics_give_the_replicas_total_load() -> None:
    asyncio.run(scenario())


async def scenario() -> None:
    async with metrics_pool(metrics) as pool:
        async with aiohttp.ClientSession() as session:
            await pool.check_all(session)
        backend = pool.backends["replica"]
        with backend.occupy(prefill_tokens=120, kv_blocks=0, waiting_tokens=120):
            state = backend.state()
            assert (state.num_running, state.num_waiting) == (5, 5), "4 waiting there, and this gateway's new one"
            assert state.queued_prefill_tokens == 120, "vLLM does not report queued prompt tokens: own ones only"
            assert state.kv_usage == 0.5


def test_sglang_metrics_give_the_replicas_total_load() -> None:
    asyncio.run(sglang_scenario())


async def sglang_scenario() -> None:
    async def sglang_metrics(request: web.Request) -> web.Response:
        return web.Response(text=SGLANG_METRICS, content_type="text/plain")

    async with metrics_pool(sglang_metrics) as pool:
        async with aiohttp.ClientSession() as session:
            await pool.check_all(session)
        backend = pool.backends["replica"]
        assert backend.reported is None, "no /stats: not a bundled engine"
        state = backend.state()
        assert (state.num_running, state.num_waiting) == (7, 2), "both schedulers' requests"
        assert state.kv_usage == 0.75, "the fuller scheduler's pool"


def test_a_later_process_start_time_is_a_restart_reported_once() -> None:
    """vLLM exports prometheus_client's ``process_start_time_seconds``: a later value is a restarted
    replica with an empty cache, however quick the restart; an earlier one (a Service whose pods
    answer in turn) is not a new restart."""
    asyncio.run(restart_scenario())


async def restart_scenario() -> None:
    start_times = iter([100.0, 100.0, 250.0, 250.0, 100.0, 250.0])

    async def restarting_metrics(request: web.Request) -> web.Response:
        started = f"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {next(start_times)}\n"
        return web.Response(text=VLLM_METRICS + started, content_type="text/plain")

    async with metrics_pool(restarting_metrics) as pool:
        restarted: list[str] = []
        pool.on_restarted = restarted.append
        async with aiohttp.ClientSession() as session:
            seen = []
            for _ in range(6):
                await pool.check_all(session)
                seen.append(len(restarted))
        assert seen == [0, 0, 1, 1, 1, 1]
        assert restarted == ["replica"] and pool.backends["replica"].restarts == 1
