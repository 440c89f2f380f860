"""The nginx zero backend the throughput bench writes serves what a kvgate gateway needs of a replica."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.nginx_backend import nginx_backend, nginx_binary
from bench.micro.throughput import start_kvgate
from tests.procs import http

pytestmark = pytest.mark.skipif(nginx_binary() is None, reason="nginx not installed (`make bench-tools` installs it)")


@pytest.fixture(scope="module")
def backend_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with nginx_backend(tmp_path_factory.mktemp("nginx")) as (url, _):
        yield url


def test_it_answers_the_polled_paths_and_nothing_else(backend_url: str) -> None:
    assert http("GET", f"{backend_url}/health").status == 200
    models = http("GET", f"{backend_url}/v1/models").json()
    assert [entry["id"] for entry in models["data"]] == ["smollm2-135m"]  # type: ignore[index]
    assert http("GET", f"{backend_url}/stats").status == 404
    assert http("GET", f"{backend_url}/metrics").status == 404
    assert http("GET", f"{backend_url}/v1/chat/completions").status == 405


def test_a_gateway_in_front_of_it_serves_chats_with_usage(backend_url: str, tmp_path: Path) -> None:
    gateway = start_kvgate(backend_url, tmp_path, workers=1)
    try:
        chat = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hello " * 3000}]}
        for _ in range(3):
            reply = http("POST", f"{gateway.url}/v1/chat/completions", chat)
            assert reply.status == 200, reply.body
            answer = reply.json()
            assert answer["choices"][0]["message"]["content"] == "ok"  # type: ignore[index]
            assert answer["usage"]["completion_tokens"] == 1  # type: ignore[index]
        backends = http("GET", f"{gateway.url}/admin/backends").json()["backends"]  # type: ignore[index]
        assert [(entry["name"], entry["healthy"], entry["breaker"]) for entry in backends] == [("zero", True, "closed")]
    finally:
        gateway.stop()
