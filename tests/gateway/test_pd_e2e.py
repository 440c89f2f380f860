"""Disaggregated prefill/decode end to end: a gateway in front of a prefill and a decode bundled engine
serving SmolLM2 with the KV connector on, beside an aggregated gateway in front of a third engine,
all real processes on loopback."""

import asyncio
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from tests.gateway_cluster import gateways_for, start_engine_set
from tests.procs import HttpReply, ManagedProcess, free_port, http

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
BLOCK = 16
CONNECTOR = '{"kv_role": "kv_both", "kv_connector_extra_config": {"hold_timeout_s": 5}}'
ENGINE_FLAGS = ("--num-blocks", "512", "--max-model-len", "4096", "--kv-transfer-config", CONNECTOR)
DOCUMENT = " ".join(f"Clause {index}: the tenant keeps the garden at number {index * 7} tidy." for index in range(40))
"""About 750 tokens: a prompt long enough that the decider moves its prefill (its stall on the decode
replica's decodes outweighs the transfer past ``stall_free_tokens``, 256), and short enough to prefill
in a second or two on a CPU: every test here prefills it at least twice.

The ``pd`` gateway's decider must split this prompt on any CPU, loaded or not, so it weighs a
decode stall at ``itl_weight: 1.0`` (default 0.1: the split then wins only below about 2,300 prompt
tokens a second, its stall of 0.1 x 500 tokens / rate against the transfer and the split's overhead,
22 ms) and prices both engines at their mean prefill rate (``prefill_rate_spread``: on a loaded
two-core machine one engine's reading can fall far below the other's, and the decider then rightly
keeps the prompt on the faster one)."""


@dataclass
class Fleet:
    prefill: ManagedProcess
    decode: ManagedProcess
    single: ManagedProcess
    pd: ManagedProcess
    """The gateway with role prefill and role decode backends."""
    always: ManagedProcess
    """The same with ``disaggregation.mode: always``: a split that no estimate can turn down."""
    aggregated: ManagedProcess
    """A gateway in front of ``single`` alone: the answer to compare with."""
    among_both: ManagedProcess
    """A gateway in front of the same two engines as ``both`` replicas, splitting among them."""
    mixed: ManagedProcess
    """A gateway in front of the same two engines as a ``prefill`` and a ``both`` replica (a mixed fleet)."""
    overflow: ManagedProcess
    """The mixed fleet whose ``prefill`` replica serves clients while the ``both`` one has over 50 ms
    of prefill queued (``prefill_overflow_s``)."""
    two_decodes: ManagedProcess
    """A ``prefill`` replica and two ``decode`` ones (``decode`` and ``single``), moving KV for free
    (``kv_bytes_per_token: 0``): a split request decodes where it waits least."""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp_path = tmp_path_factory.mktemp("pd")
    engines = start_engine_set(tmp_path, [ENGINE_FLAGS] * 3)
    prefill, decode, single = engines
    health = {"interval_s": 0.5, "timeout_s": 1.0}
    pd_config = {
        "listen": {"port": free_port()},
        "model": MODEL,
        "backends": [
            {"name": "prefill", "url": prefill.url, "role": "prefill"},
            {"name": "decode", "url": decode.url, "role": "decode"},
        ],
        "routing": {"prefill_rate_spread": 100, "disaggregation": {"itl_weight": 1.0}},
        "health": health,
    }
    always_config = {**pd_config, "listen": {"port": free_port()}, "routing": {"disaggregation": {"mode": "always"}}}
    aggregated_config = {
        "listen": {"port": free_port()},
        "model": MODEL,
        "backends": [{"name": "single", "url": single.url}],
        "health": health,
    }
    among_both_config = {
        "listen": {"port": free_port()},
        "model": MODEL,
        "backends": [{"name": "first", "url": prefill.url}, {"name": "second", "url": decode.url}],
        "routing": {"disaggregation": {"mode": "always", "among_both": True}},
        "health": health,
    }
    mixed_config = {
        **pd_config,
        "listen": {"port": free_port()},
        "backends": [
            {"name": "prefill", "url": prefill.url, "role": "prefill"},
            {"name": "serving", "url": decode.url, "role": "both"},
        ],
    }
    overflow_config = {
        **mixed_config,
        "listen": {"port": free_port()},
        "routing": {"prefill_rate_spread": 100, "disaggregation": {"prefill_overflow_s": 0.05}},
    }
    two_decodes_config = {
        **pd_config,
        "listen": {"port": free_port()},
        "backends": [
            *pd_config["backends"],
            {"name": "spare", "url": single.url, "role": "decode"},
        ],
        "routing": {"prefill_rate_spread": 100, "disaggregation": {"itl_weight": 1.0, "kv_bytes_per_token": 0}},
    }
    configs = {
        "pd": pd_config,
        "two_decodes": two_decodes_config,
        "mixed": mixed_config,
        "overflow": overflow_config,
        "always": always_config,
        "aggregated": aggregated_config,
        "among_both": among_both_config,
    }
    try:
        with gateways_for(tmp_path, configs) as gateways:
            yield Fleet(
                prefill,
                decode,
                single,
                gateways["pd"],
                gateways["always"],
                gateways["aggregated"],
                gateways["among_both"],
                gateways["mixed"],
                gateways["overflow"],
                gateways["two_decodes"],
            )
    finally:
        for engine in engines:
            engine.stop()


def ask(gateway: ManagedProcess, messages: list[dict[str, str]], **fields: Any) -> HttpReply:
    body = {"model": MODEL, "messages": messages, "max_tokens": 24, "temperature": 0, **fields}
    reply = http("POST", f"{gateway.url}/v1/chat/completions", body, timeout=300)
    assert reply.status == 200, reply.body
    return reply


def content(reply: HttpReply) -> str:
    answer = reply.json()
    assert isinstance(answer, dict)
    return answer["choices"][0]["message"]["content"]


def usage(reply: HttpReply) -> dict[str, Any]:
    answer = reply.json()
    assert isinstance(answer, dict)
    return answer["usage"]


def document_question() -> list[dict[str, str]]:
    """A long prompt no engine has seen (its first block differs)."""
    return [
        {"role": "system", "content": f"Case {uuid.uuid4().hex}. Answer from the document.\n{DOCUMENT}"},
        {"role": "user", "content": "Which number does clause 12 name?"},
    ]


def in_flight(gateway: ManagedProcess) -> dict[str, int]:
    status = http("GET", f"{gateway.url}/admin/backends").json()
    assert isinstance(status, dict)
    return {backend["name"]: backend["in_flight"] for backend in status["backends"]}


def test_a_long_uncached_prompt_disaggregates_and_answers_as_the_aggregated_engine(fleet: Fleet) -> None:
    messages = document_question()
    split = ask(fleet.pd, messages)
    alone = ask(fleet.aggregated, messages)
    assert split.headers["x-kvgate-backend"] == "decode"
    assert split.headers.get("x-kvgate-prefill-backend") == "prefill", split.headers.get("x-kvgate-pd-estimate")
    assert "pd=disaggregated; prefill=prefill; decode=decode" in split.headers["x-kvgate-route-reason"]
    assert content(split) == content(alone), "greedy output is token-identical to the aggregated engine's"
    split_usage, alone_usage = usage(split), usage(alone)
    prompt = split_usage["prompt_tokens"]
    assert prompt == alone_usage["prompt_tokens"] > 600
    assert split_usage["completion_tokens"] == alone_usage["completion_tokens"]
    assert split_usage["prompt_tokens_details"]["cached_tokens"] == (prompt - 1) // BLOCK * BLOCK, (
        "the decode answer counts the transferred blocks as cached, as vLLM does"
    )
    assert alone_usage["prompt_tokens_details"]["cached_tokens"] == 0


def test_a_follow_up_turn_stays_on_the_decode_replica_and_reuses_its_cache(fleet: Fleet) -> None:
    messages = document_question()
    first = ask(fleet.pd, messages)
    assert first.headers.get("x-kvgate-prefill-backend") == "prefill", first.headers.get("x-kvgate-pd-estimate")
    follow_up = [*messages, {"role": "assistant", "content": content(first)}, {"role": "user", "content": "And 13?"}]
    second = ask(fleet.pd, follow_up)
    assert second.headers["x-kvgate-backend"] == "decode"
    assert "pd=local-prefill-warm" in second.headers["x-kvgate-route-reason"]
    assert "x-kvgate-prefill-backend" not in second.headers
    assert usage(second)["prompt_tokens_details"]["cached_tokens"] >= usage(first)["prompt_tokens"] - BLOCK


def test_a_disaggregated_stream_carries_the_decode_answers_usage_and_is_counted_once(fleet: Fleet) -> None:
    messages = document_question()
    body = {"model": MODEL, "messages": messages, "max_tokens": 16, "temperature": 0, "stream": True}
    body["stream_options"] = {"include_usage": True}
    before = _pd_counts(fleet.pd)

    async def run() -> tuple[dict[str, str], list[bytes]]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{fleet.pd.url}/v1/chat/completions", json=body) as reply,
        ):
            return dict(reply.headers), [line async for line in reply.content if line.startswith(b"data: ")]

    headers, events = asyncio.run(run())
    assert headers["x-kvgate-prefill-backend"] == "prefill" and events[-1].strip() == b"data: [DONE]"
    assert b'"cached_tokens"' in events[-2]
    after = _pd_counts(fleet.pd)
    assert after["disaggregated"] == before.get("disaggregated", 0) + 1
    assert after["legs"] == before.get("legs", 0) + 1
    assert in_flight(fleet.pd) == {"prefill": 0, "decode": 0}


def _pd_counts(gateway: ManagedProcess) -> dict[str, float]:
    text = http("GET", f"{gateway.url}/metrics").body.decode()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith('kvgate_pd_requests_total{decision="disaggregated"}'):
            counts["disaggregated"] = float(line.split()[-1])
        if line.startswith('kvgate_pd_prefill_legs_total{backend="prefill"}'):
            counts["legs"] = float(line.split()[-1])
    return counts


def test_a_client_that_leaves_during_the_prefill_leg_frees_the_gateway_and_both_engines(fleet: Fleet) -> None:
    body = {"model": MODEL, "messages": document_question(), "max_tokens": 64, "stream": True}

    async def leave_during_prefill() -> None:
        async with aiohttp.ClientSession() as session:
            request = asyncio.create_task(session.post(f"{fleet.pd.url}/v1/chat/completions", json=body))
            deadline = time.monotonic() + 60
            while in_flight(fleet.pd)["prefill"] == 0:
                assert not request.done(), "the prefill leg ended before the client could leave"
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)

    asyncio.run(leave_during_prefill())
    deadline = time.monotonic() + 30
    while True:
        engines: list[Any] = [http("GET", f"{engine.url}/stats").json() for engine in (fleet.prefill, fleet.decode)]
        gateway = http("GET", f"{fleet.pd.url}/admin/backends").json()
        assert isinstance(gateway, dict)
        busy = sum(backend["in_flight"] + backend["kv_reserved_blocks"] for backend in gateway["backends"])
        idle = not busy and gateway["tenants_in_flight"] == {"anonymous": 0}
        freed = all(stats["running"] == 0 and stats["free_blocks"] == stats["num_blocks"] for stats in engines)
        if idle and freed:
            break
        assert time.monotonic() < deadline, (gateway, engines)
        time.sleep(0.1)


def test_replicas_all_both_split_among_themselves_and_answer_as_the_aggregated_engine(fleet: Fleet) -> None:
    messages = document_question()
    split = ask(fleet.among_both, messages)
    prefill, decode = split.headers["x-kvgate-prefill-backend"], split.headers["x-kvgate-backend"]
    assert {prefill, decode} == {"first", "second"}
    assert f"pd=disaggregated; prefill={prefill}; decode={decode}" in split.headers["x-kvgate-route-reason"]
    assert content(split) == content(ask(fleet.aggregated, messages))
    prompt = usage(split)["prompt_tokens"]
    assert usage(split)["prompt_tokens_details"]["cached_tokens"] == (prompt - 1) // BLOCK * BLOCK


def test_a_mixed_fleets_idle_both_replica_prefills_a_long_prompt_itself(fleet: Fleet) -> None:
    """Beside a ``prefill`` replica, a ``both`` replica serves the client requests, and one with no
    decodes to stall takes a long cold prompt's prefill for nothing: the split would only add the
    transfer (the decider prices a ``both`` replica's stall by the decodes it breaks)."""
    messages = document_question()
    reply = ask(fleet.mixed, messages)
    assert reply.headers["x-kvgate-backend"] == "serving"
    assert "pd=local-prefill-cheaper" in reply.headers["x-kvgate-route-reason"]
    assert reply.headers["x-kvgate-pd-estimate"].startswith("pd-local")
    assert "x-kvgate-prefill-backend" not in reply.headers
    assert content(reply) == content(ask(fleet.aggregated, messages))


def test_past_the_overflow_limit_a_mixed_fleets_prefill_replica_serves_a_client_request(fleet: Fleet) -> None:
    """While the ``both`` replica prefills a long prompt (seconds on a CPU, far past 50 ms queued), the
    next request may go to the ``prefill`` replica, which answers it whole; once idle, it takes none."""
    long_prompt = [{"role": "user", "content": f"Case {uuid.uuid4().hex}.\n{DOCUMENT * 4}\nSummarise."}]
    body = {"model": MODEL, "messages": long_prompt, "max_tokens": 4, "temperature": 0}

    messages = document_question()

    async def run() -> tuple[HttpReply, dict[str, str]]:
        async with aiohttp.ClientSession() as session:
            busy = asyncio.create_task(session.post(f"{fleet.overflow.url}/v1/chat/completions", json=body))
            deadline = time.monotonic() + 60
            while in_flight(fleet.overflow)["serving"] == 0:
                assert not busy.done() and time.monotonic() < deadline
                await asyncio.sleep(0.01)
            second = await asyncio.to_thread(ask, fleet.overflow, messages)
            async with await busy as reply:
                assert reply.status == 200
                return second, dict(reply.headers)

    second, first_headers = asyncio.run(run())
    assert first_headers["x-kvgate-backend"] == "serving"
    assert second.headers["x-kvgate-backend"] == "prefill", second.headers["x-kvgate-route-reason"]
    assert content(second) == content(ask(fleet.aggregated, messages))
    idle = ask(fleet.overflow, document_question())
    assert idle.headers["x-kvgate-backend"] == "serving", "no queue: the prefill replica takes no client"


def test_a_split_follow_up_decodes_on_the_idle_replica_not_the_busy_one_holding_its_prefix(fleet: Fleet) -> None:
    """The router places a follow-up on the decode replica holding its document, busy decoding the first
    question; the follow-up splits and, its KV free to move, decodes on the idle decode replica
    (gateway/routing/pd_decode.py), with the aggregated engine's answer and every block pulled."""
    gateway = fleet.two_decodes
    first = document_question()
    body = {"model": MODEL, "messages": first, "max_tokens": 400, "temperature": 0, "ignore_eos": True}
    follow_up = [
        first[0],
        {"role": "user", "content": "List every clause that names a number above 100, with its number. " * 36},
    ]

    async def run() -> tuple[HttpReply, dict[str, str], str]:
        async with aiohttp.ClientSession() as session:
            busy = asyncio.create_task(session.post(f"{gateway.url}/v1/chat/completions", json=body))
            deadline = time.monotonic() + 60
            while (counts := in_flight(gateway))["prefill"] or not counts["decode"] + counts["spare"]:
                assert not busy.done() and time.monotonic() < deadline
                await asyncio.sleep(0.01)
            decoding = "decode" if counts["decode"] else "spare"
            second = await asyncio.to_thread(ask, gateway, follow_up)
            async with await busy as reply:
                assert reply.status == 200
                return second, dict(reply.headers), decoding

    second, first_headers, decoding = asyncio.run(run())
    idle = "spare" if decoding == "decode" else "decode"
    assert first_headers["x-kvgate-backend"] == decoding, "the first question decodes where it was placed"
    reason = second.headers["x-kvgate-route-reason"]
    assert second.headers["x-kvgate-backend"] == idle, reason
    assert reason == f"pd-decode-cost; pd=disaggregated; prefill=prefill; decode={idle}"
    assert content(second) == content(ask(fleet.aggregated, follow_up))
    prompt = usage(second)["prompt_tokens"]
    assert usage(second)["prompt_tokens_details"]["cached_tokens"] == (prompt - 1) // BLOCK * BLOCK


def test_a_prefill_engine_killed_mid_leg_leaves_the_decode_engine_to_prefill_locally(fleet: Fleet) -> None:
    """Last in this module: it kills the prefill engine. The engine is stopped (SIGSTOP) before the
    request is sent, so its leg is still open when the kill comes however fast this CPU prefills."""
    messages = document_question()
    replies: list[HttpReply] = []
    client = threading.Thread(target=lambda: replies.append(ask(fleet.always, messages)))
    os.kill(fleet.prefill.proc.pid, signal.SIGSTOP)
    client.start()
    deadline = time.monotonic() + 60
    while in_flight(fleet.always)["prefill"] == 0:
        assert client.is_alive(), "the request was not disaggregated"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    fleet.prefill.kill()
    client.join(300)
    [reply] = replies
    assert reply.headers["x-kvgate-backend"] == "decode"
    assert "pd=prefill-leg-failed; prefill=prefill; decode=decode" in reply.headers["x-kvgate-route-reason"]
    assert content(reply) == content(ask(fleet.aggregated, messages))
    assert in_flight(fleet.always) == {"prefill": 0, "decode": 0}
    after = ask(fleet.always, document_question())
    assert after.headers["x-kvgate-backend"] == "decode", "the dead prefill replica is skipped"
