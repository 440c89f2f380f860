"""After known traffic through a gateway in front of simulated engines, /metrics adds up."""

from collections import defaultdict
from pathlib import Path

import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.observability.deployment import MODEL, Deployment, deployment
from tests.procs import http

ADMIN_KEY = "observability-test-admin-key"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
TENANT_KEY = "bike-shop-key"
TENANT = {"Authorization": f"Bearer {TENANT_KEY}"}
ACCESS = {"admin": {"api_key": ADMIN_KEY}, "tenants": [{"name": "bike-shop", "api_keys": [TENANT_KEY]}]}
SYSTEM = "You are a support assistant for a bicycle shop. " + "Answer briefly and politely. " * 30


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Deployment:
    with deployment(tmp_path_factory.mktemp("metrics"), extra_config=ACCESS) as running:
        yield running


@pytest.fixture(scope="module")
def usages(served: Deployment) -> list[dict]:
    """The usage of each served request; one bad request and one without a key are sent too."""
    answered = send_traffic(served.url)
    body = {"model": MODEL, "messages": []}
    assert http("POST", f"{served.url}/v1/chat/completions", body, headers=TENANT).status == 400
    assert http("POST", f"{served.url}/v1/chat/completions", body).status == 401
    return answered


def metric_values(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    values: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name].append((sample.labels, sample.value))
    return values


def total(values: dict, name: str, **labels: str) -> float:
    matching = (value for found, value in values[name] if all(found.get(k) == v for k, v in labels.items()))
    return sum(matching)


def send_traffic(url: str) -> list[dict]:
    """Six chat requests sharing a system prompt, every other one streamed, the last one of a session
    (``user``); their usage, as answered."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=TENANT_KEY, max_retries=0)
    usages = []
    for turn in range(6):
        question = {"role": "user", "content": f"Question {turn}: a tyre size?"}
        messages = [{"role": "system", "content": SYSTEM}, question]
        session = {"user": "rider-7"} if turn == 5 else {}
        if turn % 2:
            chunks = client.chat.completions.create(
                model=MODEL,
                messages=messages,
                max_tokens=6,
                stream=True,
                stream_options={"include_usage": True},
                **session,
            )
            usage = [chunk.usage for chunk in chunks if chunk.usage][-1]
        else:
            usage = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, **session).usage
        usages.append(usage.model_dump())
    return usages


def test_counters_add_up_to_the_responses(served: Deployment, usages: list[dict]) -> None:
    scrape = http("GET", f"{served.url}/metrics", headers=ADMIN)
    assert scrape.status == 200
    values = metric_values(scrape.body.decode())
    cached = sum(usage["prompt_tokens_details"]["cached_tokens"] for usage in usages)
    assert cached > 0
    assert total(values, "kvgate_cached_tokens_total") == cached
    assert total(values, "kvgate_prompt_tokens_total") == sum(usage["prompt_tokens"] for usage in usages)
    assert total(values, "kvgate_completion_tokens_total") == sum(usage["completion_tokens"] for usage in usages)
    assert total(values, "kvgate_requests_total", status="200", tenant="bike-shop") == len(usages)
    assert total(values, "kvgate_route_decisions_total") == len(usages)
    assert total(values, "kvgate_time_to_first_token_seconds_count") == len(usages)
    assert total(values, "kvgate_inter_token_latency_seconds_count") == 3
    assert total(values, "kvgate_queue_wait_seconds_count") == len(usages)
    assert total(values, "kvgate_rejections_total", status="400", tenant="bike-shop", cause="invalid_value") == 1
    assert total(values, "kvgate_rejections_total", status="401", tenant="unauthenticated") == 1
    assert total(values, "kvgate_backend_healthy") == len(served.engines)
    assert total(values, "kvgate_backend_circuit_state", state="closed") == len(served.engines)
    assert total(values, "kvgate_backend_in_flight") == 0
    assert total(values, "kvgate_active_sessions") == 1
    assert len(values["kvgate_session_footprint_blocks"]) == len(values["kvgate_active_sessions"]) >= 1
    assert total(values, "kvgate_answers_known") == len(usages), "every answer completed, streamed or not"
    share = sum(usage["completion_tokens"] for usage in usages) / (6 * len(usages))
    assert total(values, "kvgate_answer_length_median_share_of_max_tokens") == share == 1.0

    stats = http("GET", f"{served.url}/dashboard/stats.json", headers=ADMIN).json()
    assert stats["totals"]["cached_tokens"] == cached
    assert stats["totals"]["rejected"] == 2
    assert stats["prefix_index"]["answer_lengths"] == {"known": len(usages), "median_share_of_bound": 1.0}
    assert sum(replica["saved_tokens"] for replica in stats["replicas"]) == cached
    tenants = {tenant["tenant"]: tenant for tenant in stats["tenants"]}
    assert tenants["bike-shop"]["cached_tokens"] == cached and tenants["bike-shop"]["rejected"] == 1


def test_request_log_has_one_line_per_request_and_no_prompt_text(served: Deployment, usages: list[dict]) -> None:
    lines = [orjson.loads(line) for line in Path(served.request_log).read_text().splitlines()]
    served_lines = [line for line in lines if line["status"] == "200"]
    assert len(served_lines) == len(usages)
    assert all(line["backend"] and line["reason"] and line["ttft_s"] > 0 for line in served_lines)
    assert any(line["status"] == "400" and line["error_code"] for line in lines)
    assert "bicycle" not in Path(served.request_log).read_text()


def test_metrics_and_stats_need_the_admin_key_but_the_page_does_not(served: Deployment) -> None:
    for path in ("/metrics", "/dashboard/stats.json"):
        refused = http("GET", f"{served.url}{path}", headers={"Authorization": "Bearer wrong"})
        assert refused.status == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
    page = http("GET", f"{served.url}/dashboard")
    assert page.status == 200 and b"chart-hit-rate" in page.body
    assert http("GET", f"{served.url}/dashboard/static/chart.umd.js").status == 200
