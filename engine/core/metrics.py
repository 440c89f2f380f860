"""Prometheus metrics under vLLM's names, types and labels, so dashboards built for vLLM read the
engine and an endpoint picker that speaks GIE's Model Server Protocol (the gateway-api-inference-
extension's reference EPP, llm-d's) can drive bundled engines: ``vllm:num_requests_waiting``,
``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``, ``vllm:cache_config_info`` and
``vllm:lora_requests_info``, as ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``) writes them.
"""

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

disable_created_metrics()
_LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ENGINE_INDEX = "0"
"""vLLM labels each metric with its engine core's index (``engine``); a kvgate engine is one core."""
FINISH_REASONS = ("stop", "length", "abort")
"""vLLM's ``FinishReason`` values, the ``finished_reason`` label of ``vllm:request_success``."""

AdapterNames = tuple[list[str], list[str]]
"""The LoRA adapters of the running and of the waiting requests, by name."""


class LoRARequestsInfo(Collector):
    """``vllm:lora_requests_info{max_lora, running_lora_adapters, waiting_lora_adapters}``.

    vLLM sets this gauge to the current Unix time on every engine step, under labels naming the
    adapters of the running and of the waiting requests (comma-separated), so a reader takes the
    sample with the largest value as the latest. This collector writes that one sample at scrape
    time, from the scheduler's state then."""

    def __init__(self, max_lora: int, adapters: Callable[[], AdapterNames]) -> None:
        self.max_lora = max_lora
        self.adapters = adapters

    def collect(self) -> Iterator[Metric]:
        running, waiting = self.adapters()
        info = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
        )
        info.add_metric([str(self.max_lora), ",".join(waiting), ",".join(running)], time.time())
        yield info


class EngineMetrics:
    """The engine's metrics. ``vllm:*`` ones carry vLLM's labels (``model_name``: the served model
    name; ``engine``: "0"); ``kvgate:*`` ones, which vLLM has not, carry ``model_name`` only."""

    def __init__(
        self,
        model_name: str,
        block_size: int,
        num_blocks: int,
        host_blocks: int = 0,
        kv_cache_dtype: str = "auto",
        max_lora: int | None = None,
    ) -> None:
        """``max_lora``: with LoRA adapters, the most that may run at once (vLLM's ``--max-loras``;
        all of them when the engine sets no limit); None: no adapters, so no ``vllm:lora_requests_info``,
        as vLLM exports it only with LoRA enabled."""
        self.registry = CollectorRegistry()
        self.max_lora = max_lora
        vllm_labels = ["model_name", "engine"]
        registry = self.registry

        def kvgate_gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ["model_name"], registry=registry).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, vllm_labels, registry=registry).labels(model_name, ENGINE_INDEX)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, vllm_labels, registry=registry).labels(model_name, ENGINE_INDEX)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, vllm_labels, buckets=_LATENCY_BUCKETS, registry=registry).labels(
                model_name, ENGINE_INDEX
            )

        self.prefix_cache_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_cache_hits = counter(
            "vllm:prefix_cache_hits", "Prompt tokens found in the device prefix cache (host-tier hits not included)."
        )
        self.external_prefix_cache_queries = counter(
            "vllm:external_prefix_cache_queries", "Prompt tokens looked up beyond the device cache (host tier)."
        )
        self.external_prefix_cache_hits = counter(
            "vllm:external_prefix_cache_hits", "Prompt tokens copied back from the host KV tier instead of recomputed."
        )
        self.num_preemptions = counter("vllm:num_preemptions", "Sequences preempted for lack of KV blocks.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens admitted.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        success = Counter(
            "vllm:request_success",
            "Requests that finished, by finish reason.",
            [*vllm_labels, "finished_reason"],
            registry=registry,
        )
        self.request_success = {reason: success.labels(model_name, ENGINE_INDEX, reason) for reason in FINISH_REASONS}
        self.kv_cache_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.num_running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.num_waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.time_to_first_token = histogram("vllm:time_to_first_token_seconds", "Time from arrival to first token.")
        self.inter_token_latency = histogram(
            "vllm:inter_token_latency_seconds", "Time between consecutive output tokens."
        )
        self.e2e_latency = histogram("vllm:e2e_request_latency_seconds", "Time from arrival to the last token.")
        cache_info = {
            "block_size": str(block_size),
            "cache_dtype": kv_cache_dtype,
            "enable_prefix_caching": "True",
            "num_cpu_blocks": str(host_blocks) if host_blocks else "None",
            "num_gpu_blocks": str(num_blocks),
            "engine": ENGINE_INDEX,
        }
        """The fields of vLLM's ``CacheConfig`` this engine has (vLLM writes each as ``str(value)``;
        ``num_cpu_blocks``: the host KV tier), and the engine index; no ``model_name``, as in vLLM."""
        Gauge(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(cache_info), registry=registry
        ).labels(**cache_info).set(1)
        kvgate_gauge("kvgate:host_kv_cache_blocks", "Host KV tier capacity in blocks (0: no host tier).").set(
            host_blocks
        )
        self.host_cached_blocks = kvgate_gauge("kvgate:host_kv_cache_used_blocks", "Blocks held in the host KV tier.")
        self.host_usage = kvgate_gauge(
            "kvgate:host_kv_cache_usage_perc", "Fraction of the host KV tier holding blocks (0 to 1)."
        )

    def request_finished(self, reason: str) -> None:
        """A request ended: ``reason`` is its finish reason, or "abort"."""
        self.request_success[reason].inc()

    def track_state(self, usage: Callable[[], float], running: Callable[[], int], waiting: Callable[[], int]) -> None:
        """Read the gauges from the engine at scrape time."""
        self.kv_cache_usage.set_function(usage)
        self.num_running.set_function(running)
        self.num_waiting.set_function(waiting)

    def track_adapters(self, adapters: Callable[[], AdapterNames]) -> None:
        """Export ``vllm:lora_requests_info`` from the scheduler at scrape time (only with adapters)."""
        if self.max_lora is not None:
            self.registry.register(LoRARequestsInfo(self.max_lora, adapters))

    def track_host_tier(self, cached_blocks: Callable[[], int], usage: Callable[[], float]) -> None:
        self.host_cached_blocks.set_function(cached_blocks)
        self.host_usage.set_function(usage)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
