"""One request must not freeze the gateway (issue 28.1, 28.10, 28.14), and sampling fields are bounded.

While a hostile request is in flight, a probe thread times `GET /health` over one kept-alive
connection. Its worst wait is compared with its worst wait while ordinary small chats run, in the
same test: a request that holds the event loop (quadratic NFC reordering, a regex over megabytes,
parsing a flat million-value array) shows up as a wait of that length. Oversized `stop` and
`logit_bias` get a 400 that names the field, from the gateway and from the engine alike.
"""

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import pytest

from tests.gateway_cluster import INSTANT_SIM, MODEL, chat, gateway_config, gateway_for, running, start_engines
from tests.procs import ManagedProcess, free_port, http

SLACK_S = 0.1
"""Added to ten times the baseline's worst wait: scheduling noise on a loaded machine."""


@dataclass
class Fleet:
    gateway: ManagedProcess
    engine: ManagedProcess


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp_path: Path = tmp_path_factory.mktemp("loop-guard")
    engines = start_engines(tmp_path, 1, *INSTANT_SIM)
    normalize = {"rules": {"volatile_spans": True}}
    with running(engines), gateway_for(tmp_path, gateway_config(free_port(), engines, normalize=normalize)) as gateway:
        yield Fleet(gateway, engines[0])


class HealthProbe:
    """Times `GET /health` back to back on a background thread; ``worst_s`` is the longest wait."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._stop = threading.Event()
        self.worst_s = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "HealthProbe":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        connection = HTTPConnection("127.0.0.1", self._port, timeout=60)
        while not self._stop.is_set():
            started = time.perf_counter()
            connection.request("GET", "/health")
            connection.getresponse().read()
            self.worst_s = max(self.worst_s, time.perf_counter() - started)
            time.sleep(0.002)
        connection.close()


def post(gateway: ManagedProcess, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    reply = http("POST", f"{gateway.url}{path}", body, timeout=120)
    return reply.status, json.loads(reply.body)


def worst_wait(gateway: ManagedProcess, send: Callable[[], None]) -> float:
    with HealthProbe(gateway.port) as probe:
        time.sleep(0.05)
        send()
        time.sleep(0.05)
    return probe.worst_s


@pytest.fixture(scope="module")
def baseline_s(fleet: Fleet) -> float:
    """The probe's worst wait while ten ordinary chats are answered."""

    def ordinary() -> None:
        for _ in range(10):
            assert post(fleet.gateway, "/v1/chat/completions", json.dumps(chat(system="Be brief.")).encode())[0] == 200

    return worst_wait(fleet.gateway, ordinary)


def system_chat(text: str, role: str = "system") -> tuple[str, bytes]:
    body = chat("Hi.", 1)
    body["messages"].insert(0, {"role": role, "content": text})
    return "/v1/chat/completions", json.dumps(body).encode()


HOSTILE: dict[str, tuple[Callable[[], tuple[str, bytes]], str]] = {
    # Each is refused in the end (too long for the model, or too many JSON values): after its text was normalized.
    "combining marks in a system message": (
        lambda: system_chat("a" + "\u0301\u0323\u031b" * 15_000),
        "context_length_exceeded",
    ),
    "combining marks in a developer message": (
        lambda: system_chat("o" + "\u0315\u0316\u0334" * 15_000, role="developer"),
        "context_length_exceeded",
    ),
    "combining marks in responses instructions": (
        lambda: (
            "/v1/responses",
            json.dumps(
                {"model": MODEL, "instructions": "e" + "\U0001d167\u0345\u0300" * 12_000, "input": "Hi."}
            ).encode(),
        ),
        "context_length_exceeded",
    ),
    "combining marks in a tool description": (
        lambda: (
            "/v1/chat/completions",
            json.dumps(
                {
                    **chat("Hi.", 1),
                    "tools": [
                        {
                            "type": "function",
                            "function": {"name": "f", "description": "u" + "\u0334\u0316\u0315" * 15_000},
                        }
                    ],
                }
            ).encode(),
        ),
        "context_length_exceeded",
    ),
    "volatile-span scan of a megabyte": (lambda: system_chat("1:1:1:1:" * 125_000), "prompt_too_long"),
    "flat array of a million token ids": (
        lambda: ("/v1/completions", json.dumps({"model": MODEL, "prompt": [11] * 1_000_000}).encode()),
        "too_many_json_values",
    ),
    "object with 300k keys": (
        lambda: (
            "/v1/chat/completions",
            json.dumps({**chat("Hi.", 1), "metadata": {f"k{index}": 0 for index in range(300_000)}}).encode(),
        ),
        "too_many_json_values",
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_request_does_not_hold_the_event_loop(fleet: Fleet, baseline_s: float, name: str) -> None:
    make, expected = HOSTILE[name]
    path, body = make()
    answers: list[tuple[int, dict[str, Any]]] = []
    worst_s = worst_wait(fleet.gateway, lambda: answers.append(post(fleet.gateway, path, body)))
    status, answer = answers[0]
    assert status == 400 and answer["error"]["code"] == expected, answer
    assert worst_s < 10 * baseline_s + SLACK_S, f"{name}: /health waited {worst_s:.3f}s (ordinary: {baseline_s:.3f}s)"


SAMPLING = [
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": "x" * 1001}, "stop"),
    ({"stop": ["ok", "y" * 5000]}, "stop"),
    ({"logit_bias": {str(token): 1 for token in range(301)}}, "logit_bias"),
]


@pytest.mark.parametrize(("extra", "param"), SAMPLING)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_oversized_sampling_fields_get_a_400_naming_them(fleet: Fleet, extra: dict, param: str, path: str) -> None:
    body = chat("Hi.", 1, **extra) if path == "/v1/chat/completions" else {"model": MODEL, "prompt": "Hi", **extra}
    for server in (fleet.gateway, fleet.engine):
        status, answer = post(server, path, json.dumps(body).encode())
        assert status == 400 and answer["error"]["param"] == param, (server.url, answer)


def test_sampling_fields_within_bounds_pass(fleet: Fleet) -> None:
    body = chat("Hi.", 1, stop=["a", "b", "c", "z" * 1000], logit_bias={str(token): 1 for token in range(300)})
    assert post(fleet.gateway, "/v1/chat/completions", json.dumps(body).encode())[0] == 200
