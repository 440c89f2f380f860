"""A remote upstream that requires its API key on every path: the gateway's own reads (health,
/stats, /metrics, /v1/models) carry the key and extra headers as proxied requests do, and the key
never shows in logs, /metrics, /admin output or error bodies."""

import asyncio
import logging
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.typedefs import Handler

from tests.gateway.fake_replica import FakeReplica, gateway, gateway_config, replicas, state

KEY = f"sk-upstream-{secrets.token_hex(8)}"
MODEL = "remote-model"
VLLM_METRICS = "vllm:num_requests_running 3\nvllm:num_requests_waiting 2\nvllm:kv_cache_usage_perc 0.25\n"


@dataclass
class KeyedProvider(FakeReplica):
    """Refuses (401, echoing the key it got, as OpenAI does) any request without the key; records each."""

    model: str = MODEL
    seen: list[tuple[str, str | None, str | None]] = field(default_factory=list)
    """(path, Authorization, x-extra) of every request."""

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.require_key])
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    @web.middleware
    async def require_key(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization")
        self.seen.append((request.path, given, request.headers.get("x-extra")))
        if given != f"Bearer {KEY}":
            message = f"Incorrect API key provided: {given}."
            return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=401)
        return await handler(request)

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=VLLM_METRICS)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "max_model_len": 2048}]})

    async def chat(self, request: web.Request) -> web.Response:
        echo = f"rejected for the key {KEY}"
        return web.json_response({"error": {"message": echo, "type": "invalid_request_error"}}, status=400)

    def paths(self) -> set[str]:
        return {path for path, _, _ in self.seen}


async def test_every_read_of_a_remote_upstream_carries_its_key_and_headers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("KVGATE_TEST_UPSTREAM_KEY", KEY)
    provider = KeyedProvider()
    log = tmp_path / "requests.log"
    async with replicas(provider) as urls:
        config = gateway_config(
            urls,
            model=MODEL,
            health={"interval_s": 0.1},
            observability={"request_log_path": str(log)},
        )
        config["backends"][0].update(api_key_env="KVGATE_TEST_UPSTREAM_KEY", headers={"x-extra": "1"})
        async with gateway(config, None) as client:
            backend = state(client).pool.backends["a"]
            async with asyncio.timeout(20):
                while not {"/health", "/stats", "/metrics", "/v1/models"} <= provider.paths():
                    await asyncio.sleep(0.05)
            report = backend.latest_report
            assert report is not None and (report.running, report.waiting) == (3, 2), "the keyed /metrics was read"
            assert backend.max_model_len == 2048, "the keyed /v1/models was read"
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            async with client.post("/v1/chat/completions", json=body) as reply:
                error_body = await reply.text()
                assert reply.status == 400 and "[redacted]" in error_body
            async with client.get("/metrics") as reply:
                metrics = await reply.text()
            async with client.get("/admin/backends") as reply:
                admin = await reply.text()
            async with client.get("/v1/models") as reply:
                models = await reply.text()
    unkeyed = [(path, auth, extra) for path, auth, extra in provider.seen if auth != f"Bearer {KEY}" or extra != "1"]
    assert unkeyed == [], "every request to the upstream carries its key and extra headers"
    logs = "\n".join(record.getMessage() for record in caplog.records)
    for text in (error_body, metrics, admin, models, logs, log.read_text()):
        assert KEY not in text
