"""Dynamo as a ``bench run --peers`` contender: select_service fed by two engines' KV events, the
proxy in front (bench/peers/dynamo_proxy.py), real processes on loopback."""

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from bench.harness.contenders import Contender, FleetSpec, deploy, dynamo_install_hint, dynamo_python
from bench.peers.dynamo_proxy import has_token, prompt_token_ids
from normalize.chat_tokenizer import ChatTokenizer
from tests.procs import http

MODEL = "smollm2-135m"
SYSTEM = "You are the maintenance planner of a paper mill. " * 12


@pytest.fixture(scope="module")
def proxy_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not dynamo_python().exists():
        pytest.skip(dynamo_install_hint())
    fleet = FleetSpec(replicas=2, num_blocks=256, engine_args=("--sim-preset", "instant"))
    tokenizer = ChatTokenizer.load(MODEL)
    workdir: Path = tmp_path_factory.mktemp("dynamo-contender")
    with ExitStack() as stack:
        deployment = stack.enter_context(deploy(Contender("dynamo", "kv"), fleet, workdir, tokenizer.decode))
        yield deployment.target.urls[0]


def chat(url: str, question: str) -> tuple[str, dict]:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": 4,
    }
    reply = http("POST", f"{url}/v1/chat/completions", body)
    assert reply.status == 200, reply.body
    answer = reply.json()
    assert isinstance(answer, dict)
    return reply.headers["x-kvgate-backend"], answer["usage"]


def test_a_shared_system_prompt_goes_where_it_is_cached(proxy_url: str) -> None:
    first_backend, first = chat(proxy_url, "Which roller needs grease first?")
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    for question in ("When is the next felt change?", "Who checks the dryer section?"):
        backend, usage = chat(proxy_url, question)
        assert backend == first_backend, "Dynamo sent the prompt away from the replica caching its prefix"
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 16 * (first["prompt_tokens"] // 16 - 2)


def test_the_proxy_tokenizes_as_the_engine_does(proxy_url: str) -> None:
    tokenizer = ChatTokenizer.load(MODEL)
    messages = [{"role": "user", "content": "Count the spare bearings."}]
    _, usage = chat(proxy_url, "Count the spare bearings.")
    body = {"messages": [{"role": "system", "content": SYSTEM}, *messages]}
    assert len(prompt_token_ids("/v1/chat/completions", body, tokenizer)) == usage["prompt_tokens"]
    assert prompt_token_ids("/v1/completions", {"prompt": [5, 6, 7]}, tokenizer) == [5, 6, 7]


@pytest.mark.parametrize("body", [b"{", b"[1]", b'{"model": "smollm2-135m", "prompt": []}'])
def test_bad_bodies_get_an_openai_400(proxy_url: str, body: bytes) -> None:
    reply = http("POST", f"{proxy_url}/v1/completions", body)
    assert reply.status == 400
    error = reply.json()
    assert isinstance(error, dict) and error["error"]["type"] == "invalid_request_error"


def test_first_token_is_read_from_sse_lines() -> None:
    assert has_token(b'data: {"choices": [{"index": 0, "text": "Hi"}]}\n')
    assert has_token(b'data: {"choices": [{"delta": {"content": "Hi"}}]}\n')
    assert not has_token(b'data: {"choices": [{"delta": {"role": "assistant", "content": ""}}]}\n')
    assert not has_token(b"data: [DONE]\n")
    assert not has_token(b": keep-alive\n")
