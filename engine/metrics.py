"""Prometheus metrics under vLLM's names, so dashboards built for vLLM read the engine."""

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

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


class EngineMetrics:
    def __init__(self, model_name: str, block_size: int, num_blocks: int, host_blocks: int = 0) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        registry = self.registry

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=registry).labels(model_name)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=registry).labels(model_name)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, labels, buckets=_LATENCY_BUCKETS, registry=registry).labels(model_name)

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
        self.request_success = counter("vllm:request_success", "Requests that finished (not aborted).")
        self.kv_cache_usage = gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (0 to 1).")
        self.num_running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.num_waiting = gauge("vllm:num_requests_waiting", "Requests waiting for admission.")
        self.time_to_first_token = histogram("vllm:time_to_first_token_seconds", "Time from arrival to first token.")
        self.inter_token_latency = histogram(
            "vllm:inter_token_latency_seconds", "Time between consecutive output tokens."
        )
        self.e2e_latency = histogram("vllm:e2e_request_latency_seconds", "Time from arrival to the last token.")
        cache_info = Gauge(
            "vllm:cache_config_info", "KV cache configuration.", ["block_size", "num_gpu_blocks"], registry=registry
        )
        cache_info.labels(str(block_size), str(num_blocks)).set(1)
        Gauge(
            "kvgate:host_kv_cache_blocks",
            "Host KV tier capacity in blocks (0: no host tier).",
            labels,
            registry=registry,
        ).labels(model_name).set(host_blocks)
        self.host_cached_blocks = gauge("kvgate:host_kv_cache_used_blocks", "Blocks held in the host KV tier.")
        self.host_usage = gauge(
            "kvgate:host_kv_cache_usage_perc", "Fraction of the host KV tier holding blocks (0 to 1)."
        )

    def track_state(self, usage: Callable[[], float], running: Callable[[], int], waiting: Callable[[], int]) -> None:
        """Read the gauges from the engine at scrape time."""
        self.kv_cache_usage.set_function(usage)
        self.num_running.set_function(running)
        self.num_waiting.set_function(waiting)

    def track_host_tier(self, cached_blocks: Callable[[], int], usage: Callable[[], float]) -> None:
        self.host_cached_blocks.set_function(cached_blocks)
        self.host_usage.set_function(usage)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
