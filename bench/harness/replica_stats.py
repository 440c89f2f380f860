"""What each replica says it served, read from its Prometheus /metrics after a run."""

import urllib.request
from collections.abc import Sequence

from prometheus_client.parser import text_string_to_metric_families

REQUESTS_SERVED = "vllm:request_success_total"


def requests_served(replica_urls: Sequence[str]) -> list[int]:
    """Finished requests per replica (vLLM's counter, which the bundled engine exports too)."""
    return [int(_counter(url, REQUESTS_SERVED)) for url in replica_urls]


def _counter(url: str, sample_name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == sample_name
    )
