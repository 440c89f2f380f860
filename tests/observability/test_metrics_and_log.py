"""Request metrics add up in the exposition; the request log is one JSON line without prompts."""

import logging

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.observability.config import ObservabilityConfig
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.request_log import LOGGER_NAME, RequestLog
from gateway.observability.telemetry_record import RequestRecord


def samples(metrics: GatewayMetrics) -> dict[tuple[str, frozenset], float]:
    text = metrics.exposition().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def served(backend: str, tenant: str, prompt: int, cached: int | None, **fields: object) -> RequestRecord:
    return RequestRecord(
        request_id="r",
        model="m",
        tenant=tenant,
        backend=backend,
        reason="prefix-hit",
        prompt_tokens=prompt,
        predicted_cached_tokens=prompt // 2,
        cached_tokens=cached,
        completion_tokens=5,
        ttft_s=0.05,
        e2e_s=0.45,
        **fields,
    )


def test_token_counters_and_latencies_add_up_per_backend_and_tenant() -> None:
    metrics = GatewayMetrics()
    metrics.observe(served("a", "t1", prompt=100, cached=64, stream=True, normalized_rules=["nfc", "crlf"]))
    metrics.observe(served("a", "t1", prompt=50, cached=None))
    metrics.observe(served("b", "t2", prompt=10, cached=0, status="client_gone"))
    found = samples(metrics)
    a_t1 = frozenset({("model", "m"), ("backend", "a"), ("tenant", "t1")})
    assert found[("kvgate_prompt_tokens_total", a_t1)] == 150
    assert found[("kvgate_cached_tokens_total", a_t1)] == 64
    assert found[("kvgate_predicted_cached_tokens_total", a_t1)] == 75
    assert found[("kvgate_requests_total", a_t1 | {("status", "200")})] == 2
    b_t2 = frozenset({("model", "m"), ("backend", "b"), ("tenant", "t2"), ("status", "client_gone")})
    assert found[("kvgate_requests_total", b_t2)] == 1
    assert found[("kvgate_route_decisions_total", frozenset({("backend", "a"), ("reason", "prefix-hit")}))] == 2
    assert found[("kvgate_normalized_requests_total", frozenset({("rule", "crlf")}))] == 1
    assert found[("kvgate_normalized_cached_tokens_total", frozenset({("rule", "nfc")}))] == 64
    latency_a = frozenset({("model", "m"), ("backend", "a")})
    assert found[("kvgate_time_to_first_token_seconds_count", latency_a)] == 2
    assert found[("kvgate_inter_token_latency_seconds_count", latency_a)] == 1
    assert found[("kvgate_inter_token_latency_seconds_sum", latency_a)] == pytest.approx(0.1)
    assert found[("kvgate_e2e_request_latency_seconds_sum", latency_a)] == pytest.approx(0.9)


def test_rejections_are_counted_by_cause_not_as_requests() -> None:
    metrics = GatewayMetrics()
    metrics.observe(RequestRecord(request_id="r", model=None, tenant="t1", status="429", error_code="queue_full"))
    found = samples(metrics)
    cause = frozenset({("tenant", "t1"), ("status", "429"), ("cause", "queue_full")})
    assert found[("kvgate_rejections_total", cause)] == 1
    assert not any(name == "kvgate_requests_total" for name, _ in found)


@pytest.mark.parametrize("log_content", [False, True])
def test_request_log_is_one_json_line_with_prompt_only_when_enabled(tmp_path, log_content: bool) -> None:
    path = tmp_path / "requests.jsonl"
    log = RequestLog(ObservabilityConfig(request_log_path=str(path), log_content=log_content))
    try:
        record = served("a", "t1", prompt=100, cached=64)
        log.write(record.log_fields(), {"messages": [{"role": "user", "content": "my secret question"}]})
    finally:
        log.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 1
    entry = orjson.loads(lines[0])
    assert entry["request_id"] == "r" and entry["tenant"] == "t1" and entry["backend"] == "a"
    assert entry["reason"] == "prefix-hit" and entry["status"] == "200"
    assert entry["prompt_tokens"] == 100 and entry["cached_tokens"] == 64 and entry["ttft_s"] == 0.05
    assert ("my secret question" in lines[0]) is log_content
    assert log.handler not in logging.getLogger(LOGGER_NAME).handlers


def test_other_handlers_on_the_request_logger_get_every_line(tmp_path) -> None:
    path = tmp_path / "requests.jsonl"
    log = RequestLog(ObservabilityConfig(request_log_path=str(path)))
    seen: list[str] = []
    extra = logging.Handler()
    extra.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    try:
        log.write(served("a", "t1", prompt=100, cached=64).log_fields())
        logging.getLogger(LOGGER_NAME).addHandler(extra)
        log.write(served("b", "t1", prompt=100, cached=64).log_fields())
    finally:
        logging.getLogger(LOGGER_NAME).removeHandler(extra)
        log.close()
    lines = path.read_text().splitlines()
    assert [orjson.loads(line)["backend"] for line in lines] == ["a", "b"]
    assert seen == [lines[1]]
