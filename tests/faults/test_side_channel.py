"""Another tenant cannot tell, by timing, which prompts an isolated tenant sent (issue 18.3).

The isolated tenant sends half of the candidate prompts. The prober then sends every candidate
once with a max_tokens the gateway refuses after tokenizing (so nothing reaches an engine) and
times the refusal. A tokenizer cache shared across tenants made the isolated tenant's prompts
answer faster. The prober's best simple classifier (the faster half are "sent") must do no
better than chance: at most 65 % right. 80 candidates rather than 40 keep the chance of a
false alarm from pure noise under 1 % (a hypergeometric tail), on a loaded machine too.
"""

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway_cluster import chat, gateway_config, gateway_for, running, start_engines
from tests.procs import ManagedProcess, free_port, http

ISOLATED, PROBER = "key-isolated", "key-prober"
TENANTS = [
    {"name": "isolated", "api_keys": [ISOLATED], "isolate_cache": True},
    {"name": "prober", "api_keys": [PROBER], "limits": {"max_tokens": 64}},
]
CANDIDATES = 80
MAX_ACCURACY = 0.65
WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    tmp_path: Path = tmp_path_factory.mktemp("side-channel")
    engines = start_engines(tmp_path, 1, "--sim", "--sim-preset", "instant")
    with running(engines), gateway_for(tmp_path, gateway_config(free_port(), engines, tenants=TENANTS)) as gateway:
        yield gateway


def candidate(rng: random.Random, index: int) -> dict:
    """A chat with a long system prompt of its own (tokenizing it takes milliseconds)."""
    system = f"Confidential brief {index}: " + " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(900))
    body = chat("Summarize the brief.", 1)
    body["messages"].insert(0, {"role": "system", "content": system})
    return body


def send(gateway: ManagedProcess, key: str, body: dict) -> tuple[int, float]:
    started = time.perf_counter()
    reply = http(
        "POST", f"{gateway.url}/v1/chat/completions", json.dumps(body).encode(), {"Authorization": f"Bearer {key}"}
    )
    return reply.status, time.perf_counter() - started


def test_timing_does_not_reveal_an_isolated_tenants_prompts(gateway: ManagedProcess) -> None:
    rng = random.Random(18)
    candidates = [candidate(rng, index) for index in range(CANDIDATES)]
    sent = set(rng.sample(range(CANDIDATES), CANDIDATES // 2))
    for index in sorted(sent):
        assert send(gateway, ISOLATED, candidates[index])[0] == 200
    send(gateway, PROBER, {**candidate(rng, -1), "max_tokens": 100_000})
    order = list(range(CANDIDATES))
    rng.shuffle(order)
    timings: dict[int, float] = {}
    for index in order:
        status, elapsed = send(gateway, PROBER, {**candidates[index], "max_tokens": 100_000})
        assert status == 400
        timings[index] = elapsed
    fastest_half = set(sorted(timings, key=timings.__getitem__)[: CANDIDATES // 2])
    accuracy = (len(fastest_half & sent) + len(set(timings) - fastest_half - sent)) / CANDIDATES
    assert accuracy <= MAX_ACCURACY, f"the prober classified {accuracy:.0%} of the candidates right"
