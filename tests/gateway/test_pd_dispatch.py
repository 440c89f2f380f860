"""Disaggregated prefill/decode in process: the real gateway app in front of stand-ins for vLLM P/D
replicas (they answer a prefill leg with NixlConnector-shaped ``kv_transfer_params``), so each leg's
body, the fallbacks and the bookkeeping can be checked exactly."""

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from gateway.backends.circuit_breaker import BreakerState
from tests.gateway.fake_replica import (
    PROMPT_TOKENS,
    Behaviour,
    FakeReplica,
    chat,
    gateway,
    gateway_config,
    replicas,
    sse_payloads,
    state,
)

PARAMS = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_engine_id": "prefill-engine",
    "remote_request_id": "r-1",
    "remote_block_ids": [1, 2, 3],
    "remote_host": "127.0.0.1",
    "remote_port": 5600,
    "tp_size": 1,
}


@dataclass
class PdReplica(FakeReplica):
    """A fake replica that answers a prefill leg (``do_remote_decode``) as vLLM's NixlConnector does."""

    params: dict[str, Any] | None = None
    hold_prefill: bool = False
    """Wait on ``release`` before answering a prefill leg."""
    prefill_arrived: asyncio.Event | None = None
    decode_arrived: asyncio.Event | None = None
    """Set when a whole request (or a decode leg) arrives; it then waits on ``release``."""
    request_ids: list[str | None] = field(default_factory=list)
    """The ``X-Request-Id`` of every completion it got."""

    async def complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.request_ids.append(request.headers.get("X-Request-Id"))
        transfer = body.get("kv_transfer_params") or {}
        if not transfer.get("do_remote_decode"):
            return await self._answer(request, body)
        self.bodies.append(body)
        if self.prefill_arrived is not None:
            self.prefill_arrived.set()
        if self.hold_prefill:
            await self.release.wait()
        if self.behaviour is Behaviour.DROP:
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        if self.behaviour is Behaviour.FAIL_500:
            return web.json_response({"error": {"message": "out of memory", "type": "server_error"}}, status=500)
        if self.behaviour is Behaviour.REJECT_400:
            return web.json_response({"error": {"message": "bad", "type": "invalid_request_error"}}, status=400)
        answer = {**self.whole_answer(), "kv_transfer_params": self.params}
        return web.json_response(answer)

    async def _answer(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        self.bodies.append(body)
        if self.decode_arrived is not None:
            self.decode_arrived.set()
            await self.release.wait()
        if not body.get("stream"):
            return web.json_response(self.whole_answer())
        return await self.stream(request, body)


def pd_config(urls: list[str], mode: str = "always", **sections: Any) -> dict[str, Any]:
    """Backend a is the prefill replica, b the decode replica."""
    config = gateway_config(urls, **sections)
    config["backends"][0]["role"] = "prefill"
    config["backends"][1]["role"] = "decode"
    config["routing"] = {"policy": "round_robin", "disaggregation": {"mode": mode}}
    return config


async def test_a_disaggregated_request_sends_the_prefill_leg_then_the_original_body_with_its_params(
    tmp_path: Path,
) -> None:
    prefill, decode = PdReplica(params=PARAMS, cached_tokens=16), PdReplica(cached_tokens=40)
    log = tmp_path / "requests.log"
    async with (
        replicas(prefill, decode) as urls,
        gateway(pd_config(urls, observability={"request_log_path": str(log)}), None) as client,
    ):
        body = chat("a question", stream=True, stream_options={"include_usage": True}, max_tokens=8)
        async with client.post("/v1/chat/completions", json=body) as reply:
            headers, events = reply.headers, await sse_payloads(reply)
        metrics = await (await client.get("/metrics")).text()
        stats = await (await client.get("/dashboard/stats.json")).json()
        pool = state(client).pool
        occupancy = {
            name: (b.in_flight, b.in_flight_prefill_tokens, b.kv_reserved_blocks) for name, b in pool.backends.items()
        }
        calibration = state(client).router.stats().calibration
    [leg] = prefill.bodies
    assert leg["max_tokens"] == 1 and leg["stream"] is False and leg["n"] == 1 and "stream_options" not in leg
    assert leg["kv_transfer_params"] == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    [sent] = decode.bodies
    assert sent["kv_transfer_params"] == PARAMS and sent["max_tokens"] == 8 and sent["stream"] is True
    assert prefill.request_ids == decode.request_ids != [None], "both legs carry one X-Request-Id"
    assert headers["x-kvgate-backend"] == "b" and headers["x-kvgate-prefill-backend"] == "a"
    assert "pd=disaggregated; prefill=a; decode=b" in headers["x-kvgate-route-reason"]
    assert events[-1] == b"[DONE]" and events[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] == 40
    assert 'kvgate_pd_requests_total{decision="disaggregated"} 1.0' in metrics
    assert 'kvgate_pd_prefill_cached_tokens_total{backend="a"} 16.0' in metrics
    assert stats["pd"]["decisions"] == {"disaggregated": 1}
    assert stats["pd"]["prefill_legs"][0]["backend"] == "a" and stats["pd"]["prefill_legs"][0]["cached_tokens"] == 16
    assert occupancy == {"a": (0, 0, 0), "b": (0, 0, 0)}
    assert calibration.count == 1, "the prefill leg calibrates; the decode leg's transferred hit does not"
    [line] = [orjson.loads(line) for line in log.read_text().splitlines()]
    assert line["charged_tokens"] == PROMPT_TOKENS + 3, "charged once: the decode answer's usage"
    assert (line["backend"], line["pd"], line["prefill_backend"]) == ("b", "disaggregated", "a")
    assert (line["cached_tokens"], line["prefill_cached_tokens"]) == (40, 16)


async def test_prefill_only_replicas_never_get_a_whole_request_and_decode_only_never_a_leg() -> None:
    prefill, decode = PdReplica(params=PARAMS), PdReplica()
    async with replicas(prefill, decode) as urls, gateway(pd_config(urls, mode="never"), None) as client:
        for index in range(4):
            async with client.post("/v1/chat/completions", json=chat(f"question {index}")) as reply:
                assert reply.status == 200 and reply.headers["x-kvgate-backend"] == "b"
                assert "pd=local-prefill-never" in reply.headers["x-kvgate-route-reason"]
                assert "x-kvgate-prefill-backend" not in reply.headers
    assert prefill.bodies == [] and len(decode.bodies) == 4


async def send_to_replicas_all_both(among_both: bool) -> tuple[dict[str, str], dict[str, list[dict]]]:
    """One request to two ``both`` replicas that answer prefill legs; its headers and each one's bodies."""
    first, second = PdReplica(params=PARAMS), PdReplica(params=PARAMS)
    routing = {"policy": "round_robin", "disaggregation": {"mode": "always", "among_both": among_both}}
    async with (
        replicas(first, second) as urls,
        gateway(gateway_config(urls, routing=routing), None) as client,
        client.post("/v1/chat/completions", json=chat("a question")) as reply,
    ):
        assert reply.status == 200
        return dict(reply.headers), {"a": first.bodies, "b": second.bodies}


async def test_replicas_all_both_run_as_before_without_among_both() -> None:
    headers, bodies = await send_to_replicas_all_both(among_both=False)
    assert "pd=" not in headers["x-kvgate-route-reason"] and "x-kvgate-prefill-backend" not in headers
    [sent] = bodies[headers["x-kvgate-backend"]]
    assert "kv_transfer_params" not in sent and sum(len(sent) for sent in bodies.values()) == 1


async def test_replicas_all_both_disaggregate_with_among_both() -> None:
    headers, bodies = await send_to_replicas_all_both(among_both=True)
    prefill, decode = headers["x-kvgate-prefill-backend"], headers["x-kvgate-backend"]
    assert prefill != decode
    assert f"pd=disaggregated; prefill={prefill}; decode={decode}" in headers["x-kvgate-route-reason"]
    [leg], [sent] = bodies[prefill], bodies[decode]
    assert leg["max_tokens"] == 1 and leg["kv_transfer_params"]["do_remote_decode"] is True
    assert sent["kv_transfer_params"] == PARAMS


async def test_n_above_one_and_embeddings_never_disaggregate() -> None:
    prefill, decode = PdReplica(params=PARAMS), PdReplica()
    async with (
        replicas(prefill, decode) as urls,
        gateway(pd_config(urls), None) as client,
        client.post("/v1/chat/completions", json=chat("two samples", n=2)) as reply,
    ):
        assert reply.status == 200 and "pd=" not in reply.headers["x-kvgate-route-reason"]
    assert prefill.bodies == [] and "kv_transfer_params" not in decode.bodies[0]


async def test_a_failed_prefill_leg_leaves_the_decode_replica_to_prefill_locally() -> None:
    for behaviour in (Behaviour.DROP, Behaviour.FAIL_500):
        prefill, decode = PdReplica(behaviour, params=PARAMS), PdReplica()
        async with replicas(prefill, decode) as urls, gateway(pd_config(urls), None) as client:
            async with client.post("/v1/chat/completions", json=chat("a question")) as reply:
                status, headers, answer = reply.status, reply.headers, await reply.json()
            pool = state(client).pool
        assert status == 200 and answer["choices"][0]["message"]["content"] == "Hello there!", behaviour
        assert "pd=prefill-leg-failed; prefill=a; decode=b" in headers["x-kvgate-route-reason"]
        assert "x-kvgate-prefill-backend" not in headers
        assert "kv_transfer_params" not in decode.bodies[0]
        assert pool.backends["a"].breaker._failures == 1, f"{behaviour}: the prefill replica was at fault"
        assert pool.backends["b"].in_flight == pool.backends["a"].in_flight == 0


async def test_after_a_failed_prefill_leg_the_decode_replica_counts_the_prompt_as_its_queued_prefill() -> None:
    """Routing must see the prefill the decode replica now does itself, until its first token."""
    arrived = asyncio.Event()
    prefill, decode = PdReplica(Behaviour.FAIL_500, params=PARAMS), PdReplica(decode_arrived=arrived)
    async with replicas(prefill, decode) as urls, gateway(pd_config(urls), None) as client:
        reply = asyncio.create_task(client.post("/v1/chat/completions", json=chat("a question")))
        await asyncio.wait_for(arrived.wait(), 10)
        backend = state(client).pool.backends["b"]
        queued, reported = backend.in_flight_prefill_tokens, backend.state().queued_prefill_tokens
        decode.release.set()
        async with await reply as answer:
            assert answer.status == 200 and "pd=prefill-leg-failed" in answer.headers["x-kvgate-route-reason"]
        after = backend.in_flight_prefill_tokens
    assert queued > 0 and reported == queued, "the whole uncached prompt is queued work on the decode replica"
    assert after == 0


async def test_a_prefill_answer_without_params_falls_back_to_a_local_prefill() -> None:
    prefill, decode = PdReplica(params=None), PdReplica()
    async with (
        replicas(prefill, decode) as urls,
        gateway(pd_config(urls), None) as client,
        client.post("/v1/chat/completions", json=chat("a question")) as reply,
    ):
        assert reply.status == 200 and "pd=prefill-leg-failed" in reply.headers["x-kvgate-route-reason"]
    assert len(prefill.bodies) == 1 and "kv_transfer_params" not in decode.bodies[0]


async def test_a_4xx_prefill_answer_reaches_the_client_and_counts_against_no_replica() -> None:
    prefill, decode = PdReplica(Behaviour.REJECT_400, params=PARAMS), PdReplica()
    async with replicas(prefill, decode) as urls, gateway(pd_config(urls), None) as client:
        async with client.post("/v1/chat/completions", json=chat("a question")) as reply:
            status, answer = reply.status, await reply.json()
        pool = state(client).pool
        tenants = (await (await client.get("/admin/backends")).json())["tenants_in_flight"]
    assert status == 400 and answer["error"]["message"] == "bad"
    assert decode.bodies == []
    assert [backend.breaker._failures for backend in pool.backends.values()] == [0, 0]
    assert all(backend.breaker.state is BreakerState.CLOSED for backend in pool.backends.values())
    assert tenants == {"anonymous": 0}


async def test_a_client_that_leaves_during_the_prefill_leg_frees_both_replicas() -> None:
    arrived = asyncio.Event()
    prefill, decode = PdReplica(params=PARAMS, hold_prefill=True, prefill_arrived=arrived), PdReplica()
    async with replicas(prefill, decode) as urls, gateway(pd_config(urls), None) as client:
        pool = state(client).pool
        request = asyncio.create_task(client.post("/v1/chat/completions", json=chat("a question", stream=True)))
        await asyncio.wait_for(arrived.wait(), 10)
        assert pool.backends["a"].in_flight == 1 and pool.backends["b"].in_flight == 1
        assert pool.backends["b"].in_flight_prefill_tokens == 0, "the decode replica is not prefilling it"
        request.cancel()
        for _ in range(200):
            idle = all(not b.in_flight and not b.kv_reserved_blocks for b in pool.backends.values())
            status = await (await client.get("/admin/backends")).json()
            if idle and status["tenants_in_flight"] == {"anonymous": 0}:
                break
            await asyncio.sleep(0.02)
        prefill.release.set()
        router = state(client).router.stats()
        metrics = await (await client.get("/metrics")).text()
    assert idle and status["tenants_in_flight"] == {"anonymous": 0}
    assert decode.bodies == [], "the decode leg was never sent"
    assert all(replica.blocks == 0 for replica in router.index.per_replica.values()), "both tickets undone"
    assert 'kvgate_pd_requests_total{decision="disaggregated"} 1.0' in metrics
    assert 'kvgate_pd_prefill_legs_total{backend="a"} 1.0' in metrics, "the leg was sent, so it counts"


async def test_a_retry_after_the_decode_replica_failed_prefills_where_it_lands() -> None:
    prefill, dropping, healthy = PdReplica(params=PARAMS), FakeReplica(Behaviour.DROP), FakeReplica()
    async with replicas(prefill, dropping, healthy) as urls:
        config = pd_config(urls)
        config["backends"][2]["role"] = "decode"
        async with gateway(config, None) as client:
            reasons = []
            for index in range(2):
                async with client.post("/v1/chat/completions", json=chat(f"question {index}")) as reply:
                    assert reply.status == 200 and reply.headers["x-kvgate-backend"] == "c"
                    reasons.append(reply.headers["x-kvgate-route-reason"])
    assert len(dropping.bodies) >= 1, "round robin sent one of the two requests to b first"
    assert dropping.bodies[0]["kv_transfer_params"] == PARAMS
    assert sum(reason.startswith("retry; pd=local-prefill-retry") for reason in reasons) == len(dropping.bodies)
    retried = [body for body in healthy.bodies if "kv_transfer_params" not in body]
    assert len(retried) == len(dropping.bodies), "a retry prefills locally"


async def test_a_split_request_decodes_where_it_waits_least_once_moving_its_kv_costs_nothing() -> None:
    """The router places a follow-up on the replica holding its document, which is decoding the first
    request; split, the follow-up prefills none of its prompt there, and with a free link
    (``kv_bytes_per_token: 0``) the idle decode replica serves it sooner (gateway/routing/pd_decode.py)."""
    arrivals = {"b": asyncio.Event(), "c": asyncio.Event()}
    prefill = PdReplica(params=PARAMS)
    decoders = {name: PdReplica(decode_arrived=arrived) for name, arrived in arrivals.items()}
    document = " ".join(f"clause {index} of the contract." for index in range(300))
    async with replicas(prefill, *decoders.values()) as urls:
        config = pd_config(urls, mode="conditional")
        config["backends"][2]["role"] = "decode"
        config["routing"] = {"disaggregation": {"mode": "conditional", "kv_bytes_per_token": 0}}
        async with gateway(config, None) as client:
            first = asyncio.create_task(client.post("/v1/chat/completions", json=chat(f"{document} Summarise.")))
            waits = [asyncio.create_task(arrived.wait()) for arrived in arrivals.values()]
            await asyncio.wait(waits, timeout=10, return_when=asyncio.FIRST_COMPLETED)
            [busy] = [name for name, arrived in arrivals.items() if arrived.is_set()]
            [idle] = set(arrivals) - {busy}
            decoders[idle].release.set()
            safety = asyncio.get_running_loop().call_later(10, decoders[busy].release.set)  # fail, not hang
            question = f"{document} Which clauses mention payment? " + "Answer in full. " * 300
            async with client.post("/v1/chat/completions", json=chat(question)) as reply:
                status, headers = reply.status, reply.headers
            decoders[busy].release.set()
            safety.cancel()
            async with await first as answer:
                first_status, first_headers = answer.status, answer.headers
            pool = state(client).pool
            occupancy = [
                (b.in_flight, b.in_flight_prefill_tokens, b.kv_reserved_blocks) for b in pool.backends.values()
            ]
        for waiting in waits:
            waiting.cancel()
    assert first_status == status == 200
    assert first_headers["x-kvgate-backend"] == busy and "pd=disaggregated" in first_headers["x-kvgate-route-reason"]
    assert headers["x-kvgate-backend"] == idle and headers["x-kvgate-prefill-backend"] == "a"
    assert headers["x-kvgate-route-reason"] == f"pd-decode-cost; pd=disaggregated; prefill=a; decode={idle}"
    assert headers["x-kvgate-pd-estimate"].startswith("pd-split: est ")
    assert [body["kv_transfer_params"] for body in decoders[idle].bodies] == [PARAMS]
    assert len(decoders[busy].bodies) == 1 and len(prefill.bodies) == 2
    assert occupancy == [(0, 0, 0)] * 3
