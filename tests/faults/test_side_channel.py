"""Another tenant cannot tell, by timing, which prompts an isolated tenant sent (issues 18.3, 28.5).

The isolated tenant sends half of the candidate prompts. The prober then sends every candidate
once with a max_tokens the gateway refuses after tokenizing (so nothing reaches an engine) and
times the refusal. A tokenizer cache shared across tenants made the isolated tenant's prompts
answer faster: the segment cache (long system prompts), then the word cache of short ASCII text
(a few hundred words not in the vocabulary, in a system message or a Responses `instructions`).
The prober's best simple classifier (the faster half are "sent") must do no better than chance:
at most 65 % right. Under pure noise the prober's hits follow a hypergeometric law whatever the
machine's load (the probe order is shuffled), so the candidate count sets the false-alarm rate:
80 candidates left it at 0.17 % a variant, 0.5 % a run (it fired once in CI); 200 leave it at
5e-6 a variant (66 of 100 or more), while a leaking cache (0.1 ms against several ms) is still
caught near 100 %.
"""

import json
import random
import statistics
import string
import time
from collections.abc import Callable, Iterator
from http.client import HTTPConnection

import pytest

from tests.gateway_cluster import MODEL, chat, gateway_with_engines
from tests.procs import ManagedProcess

ISOLATED, PROBER = "key-isolated", "key-prober"
TENANTS = [
    {"name": "isolated", "api_keys": [ISOLATED], "isolate_cache": True},
    {"name": "prober", "api_keys": [PROBER], "limits": {"max_tokens": 64}},
]
CANDIDATES = 200
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
    with gateway_with_engines(tmp_path_factory.mktemp("side-channel"), tenants=TENANTS) as gateway:
        yield gateway


def long_system_prompt(rng: random.Random, index: int) -> tuple[str, dict]:
    """A chat with a long system prompt of its own (tokenizing it takes milliseconds)."""
    system = f"Confidential brief {index}: " + " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(900))
    body = chat("Summarize the brief.", 1)
    body["messages"].insert(0, {"role": "system", "content": system})
    return "/v1/chat/completions", body


def rare_words(rng: random.Random, chars: int = 1900) -> str:
    """Long words of random letters as fit in ``chars``: text short enough to be tokenized word by word
    on the event loop (segment_tokenizer.OFFLOAD_CHARS), and slow to tokenize unless cached (BPE
    merges a mixed-case 30-60 letter word in many steps: ~9 ms for the text against 0.1 ms)."""
    words: list[str] = []
    while sum(map(len, words)) + len(words) < chars - 64:
        words.append("".join(rng.choice(string.ascii_letters) for _ in range(rng.randrange(30, 60))))
    return " ".join(words)


def rare_word_system_prompt(rng: random.Random, index: int) -> tuple[str, dict]:
    body = chat("Summarize the brief.", 1)
    body["messages"].insert(0, {"role": "system", "content": rare_words(rng)})
    return "/v1/chat/completions", body


def rare_word_instructions(rng: random.Random, index: int) -> tuple[str, dict]:
    return "/v1/responses", {
        "model": MODEL,
        "instructions": rare_words(rng),
        "input": "Summarize.",
        "max_output_tokens": 1,
    }


_CONNECTIONS: dict[tuple[int, str], HTTPConnection] = {}


def send(gateway: ManagedProcess, key: str, path: str, body: dict) -> tuple[int, float]:
    """Over one kept-alive connection per tenant: a fresh connection's setup would drown a 1 ms signal."""
    connection = _CONNECTIONS.setdefault((gateway.port, key), HTTPConnection("127.0.0.1", gateway.port, timeout=60))
    data = json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    started = time.perf_counter()
    connection.request("POST", path, data, headers)
    reply = connection.getresponse()
    reply.read()
    return reply.status, time.perf_counter() - started


def refused(path: str, body: dict) -> dict:
    """The body with a token limit the gateway refuses only after tokenizing the prompt."""
    return {**body, ("max_output_tokens" if path == "/v1/responses" else "max_tokens"): 100_000}


@pytest.mark.parametrize("make", [long_system_prompt, rare_word_system_prompt, rare_word_instructions])
def test_timing_does_not_reveal_an_isolated_tenants_prompts(
    gateway: ManagedProcess, make: Callable[[random.Random, int], tuple[str, dict]]
) -> None:
    rng = random.Random(f"18-{make.__name__}")  # each variant its own words: the gateway is shared
    candidates = [make(rng, index) for index in range(CANDIDATES)]
    sent = set(rng.sample(range(CANDIDATES), CANDIDATES // 2))
    for index in sorted(sent):
        assert send(gateway, ISOLATED, *candidates[index])[0] == 200
    warm_path, warm_body = make(rng, -1)
    send(gateway, PROBER, warm_path, refused(warm_path, warm_body))
    order = list(range(CANDIDATES))
    rng.shuffle(order)
    timings: dict[int, float] = {}
    for index in order:
        path, body = candidates[index]
        status, elapsed = send(gateway, PROBER, path, refused(path, body))
        assert status == 400
        timings[index] = elapsed
    fastest_half = set(sorted(timings, key=timings.__getitem__)[: CANDIDATES // 2])
    accuracy = (len(fastest_half & sent) + len(set(timings) - fastest_half - sent)) / CANDIDATES
    medians = [statistics.median(timings[index] for index in group) for group in (sent, set(timings) - sent)]
    assert accuracy <= MAX_ACCURACY, (
        f"the prober classified {accuracy:.0%} of the candidates right "
        f"(median {medians[0] * 1000:.1f} ms for sent prompts, {medians[1] * 1000:.1f} ms for the others)"
    )
