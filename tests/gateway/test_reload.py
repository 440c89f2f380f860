"""reload.py in process: `POST /admin/reload` re-reads the config file and applies what may change live.

Backends are added and drained; a block_size change is refused and the running config stays; a
listen change waits for a restart; a model or tokenizer change rebuilds what serves requests;
without a config file there is nothing to reload (409).
"""

from pathlib import Path
from typing import Any

import yaml
from aiohttp.test_utils import TestClient

from normalize.prompt_tokenizer import ApproximateTokenizer
from normalize.segment_tokenizer import SegmentTokenizer
from tests.gateway.fake_replica import MODEL, FakeReplica, chat, gateway, gateway_config, replicas, state


async def reload_with(client: TestClient, config_file: Path, config: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    config_file.write_text(yaml.safe_dump(config))
    async with client.post("/admin/reload") as reply:
        return reply.status, await reply.json()


async def served_by(client: TestClient, requests: int) -> list[str]:
    backends = []
    for index in range(requests):
        async with client.post("/v1/chat/completions", json=chat(f"question {index}")) as reply:
            assert reply.status == 200, await reply.text()
            backends.append(reply.headers["x-kvgate-backend"])
    return backends


async def test_reload_adds_a_backend_and_drains_a_removed_one(tmp_path: Path) -> None:
    first, second = FakeReplica(), FakeReplica()
    async with replicas(first, second) as urls:
        config = gateway_config(urls[:1])
        async with gateway(config, tmp_path / "gateway.yaml") as client:
            assert await served_by(client, 2) == ["a", "a"]
            both = {**config, "backends": gateway_config(urls)["backends"]}
            status, body = await reload_with(client, tmp_path / "gateway.yaml", both)
            assert (status, body) == (200, {"status": "reloaded", "backends": ["a", "b"]})
            assert sorted(await served_by(client, 4)) == ["a", "a", "b", "b"]

            only_b = {**config, "backends": both["backends"][1:]}
            status, body = await reload_with(client, tmp_path / "gateway.yaml", only_b)
            assert (status, body["backends"]) == (200, ["b"])
            assert set(state(client).pool.backends) == {"b"}, "a was idle, so it left at once"
            assert await served_by(client, 2) == ["b", "b"]
    assert len(first.bodies) == 4 and len(second.bodies) == 4


async def test_a_block_size_change_is_refused_and_the_running_config_stays(tmp_path: Path) -> None:
    async with replicas(FakeReplica()) as urls:
        config = gateway_config(urls)
        async with gateway(config, tmp_path / "gateway.yaml") as client:
            status, body = await reload_with(client, tmp_path / "gateway.yaml", {**config, "block_size": 32})
            assert status == 400 and body["error"]["code"] == "invalid_config"
            assert "block_size cannot change without a restart" in body["error"]["message"]
            assert state(client).config.block_size == 16
            assert await served_by(client, 1) == ["a"]


async def test_a_listen_change_is_accepted_but_waits_for_a_restart(tmp_path: Path) -> None:
    async with replicas(FakeReplica()) as urls:
        config = gateway_config(urls, limits={"max_tokens": 64})
        async with gateway(config, tmp_path / "gateway.yaml") as client:
            moved = {**config, "listen": {"host": "127.0.0.1", "port": config["listen"]["port"] + 1}}
            moved["limits"] = {"max_tokens": 4}
            status, _ = await reload_with(client, tmp_path / "gateway.yaml", moved)
            running = state(client).config
            assert status == 200
            assert running.listen.port == config["listen"]["port"], "the socket it listens on stays"
            assert running.limits.max_tokens == 4, "the rest of the file applies"


async def test_a_model_or_tokenizer_change_rebuilds_what_serves_requests(tmp_path: Path) -> None:
    async with replicas(FakeReplica(model="renamed")) as urls:
        config = gateway_config(urls)
        async with gateway(config, tmp_path / "gateway.yaml") as client:
            assert isinstance(state(client).models.get(MODEL).tokenizer, ApproximateTokenizer)
            renamed = {**config, "model": "renamed", "tokenizer": MODEL}
            status, _ = await reload_with(client, tmp_path / "gateway.yaml", renamed)
            assert status == 200
            async with client.get("/v1/models") as reply:
                assert [model["id"] for model in (await reply.json())["data"]] == ["renamed"]
            assert isinstance(state(client).models.get("renamed").tokenizer, SegmentTokenizer)
            async with client.post("/v1/chat/completions", json=chat()) as reply:
                assert reply.status == 404 and (await reply.json())["error"]["code"] == "model_not_found"
            async with client.post("/v1/chat/completions", json={**chat(), "model": "renamed"}) as reply:
                assert reply.status == 200 and reply.headers["x-kvgate-backend"] == "a"


async def test_without_a_config_file_reload_is_409() -> None:
    async with (
        replicas(FakeReplica()) as urls,
        gateway(gateway_config(urls), None) as client,
        client.post("/admin/reload") as reply,
    ):
        status, body = reply.status, await reply.json()
    assert status == 409 and body["error"]["code"] == "no_config_file"
