"""The request log keeps the error code a backend answered with (real gateway and sim engine on loopback)."""

import time
from pathlib import Path

import orjson
import pytest

from tests.observability.deployment import MODEL, deployment
from tests.procs import http

pytestmark = pytest.mark.slow


def test_a_backend_400_keeps_its_code_in_the_request_log(tmp_path: Path) -> None:
    with deployment(tmp_path, replicas=1) as cluster:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "response_format": {"type": "json_object"},
        }
        reply = http("POST", f"{cluster.url}/v1/chat/completions", body, {"x-request-id": "backend-400"})
        assert reply.status == 400
        assert reply.json()["error"]["code"] == "unsupported_parameter"  # type: ignore[index]
        deadline = time.monotonic() + 10
        records: list[dict] = []
        while not records and time.monotonic() < deadline:
            lines = cluster.request_log.read_text().splitlines() if cluster.request_log.exists() else []
            records = [record for line in lines if (record := orjson.loads(line))["request_id"] == "backend-400"]
            time.sleep(0.1)
        assert records, "the request was never logged"
        assert records[0]["status"] == "400"
        assert records[0]["error_code"] == "unsupported_parameter"
