"""``observability.pricing``: each served request's cost and cache savings in the request log, /metrics
and the dashboard's per-tenant stats (real gateway and sim engine on loopback)."""

import time
from pathlib import Path

import orjson
import pytest

from gateway.observability.pricing import ModelPrice, request_cost
from tests.observability.deployment import MODEL, deployment
from tests.procs import http

pytestmark = pytest.mark.slow

PRICE = {"input": 2.0, "cached_input": 0.5, "cache_write": 2.5, "output": 8.0}


def test_request_cost_splits_cached_and_written_prompt_tokens() -> None:
    priced = request_cost(ModelPrice(**PRICE), prompt_tokens=1000, cached_tokens=800, completion_tokens=10)
    assert priced.cost == pytest.approx((800 * 0.5 + 200 * 2.5 + 10 * 8.0) / 1e6)
    assert priced.savings == pytest.approx(800 * 1.5 / 1e6)
    no_surcharge = ModelPrice(input=2.0, cached_input=0.5, output=8.0)
    assert request_cost(no_surcharge, 100, 0, 0).cost == pytest.approx(100 * 2.0 / 1e6)


def test_cost_and_savings_reach_the_log_metrics_and_dashboard(tmp_path: Path) -> None:
    log_path = tmp_path / "requests.jsonl"
    observability = {"request_log_path": str(log_path), "stats_bucket_s": 1, "pricing": {MODEL: PRICE}}
    with deployment(tmp_path, replicas=1, extra_config={"observability": observability}) as cluster:
        body = {
            "model": MODEL,
            "messages": [{"role": "system", "content": "You answer questions about trains. " * 30}],
            "max_tokens": 4,
        }
        for request_id in ("cold", "warm"):
            assert http("POST", f"{cluster.url}/v1/chat/completions", body, {"x-request-id": request_id}).status == 200
        records = _logged(log_path, {"cold", "warm"})
        warm = records["warm"]
        assert warm["cached_tokens"] > 0
        expected = request_cost(
            ModelPrice(**PRICE), warm["prompt_tokens"], warm["cached_tokens"], warm["completion_tokens"]
        )
        assert warm["cost"] == pytest.approx(expected.cost)
        assert warm["cache_savings"] == pytest.approx(expected.savings) and warm["cache_savings"] > 0
        total_cost = records["cold"]["cost"] + warm["cost"]
        metrics = http("GET", f"{cluster.url}/metrics").body.decode()
        assert f'kvgate_cost_total{{model="{MODEL}",tenant="anonymous"}}' in metrics
        stats = http("GET", f"{cluster.url}/dashboard/stats.json").json()
        tenant = stats["tenants"][0]  # type: ignore[index]
        assert tenant["cost"] == pytest.approx(total_cost)
        assert tenant["cache_savings"] == pytest.approx(records["cold"]["cache_savings"] + warm["cache_savings"])


def _logged(path: Path, request_ids: set[str]) -> dict[str, dict]:
    deadline = time.monotonic() + 10
    found: dict[str, dict] = {}
    while set(found) != request_ids and time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        found = {
            record["request_id"]: record
            for line in lines
            if (record := orjson.loads(line))["request_id"] in request_ids
        }
        time.sleep(0.1)
    assert set(found) == request_ids, found
    return found
