"""Hot reload under load drops nothing; a broken config is refused; shutdown drains in-flight requests."""

import asyncio
import os
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from tests.gateway_cluster import (
    SLOW_SIM,
    chat,
    gateway_config,
    gateway_for,
    get_json,
    post,
    running,
    start_engines,
    stream,
    wait_for_status,
    write_config,
)
from tests.procs import ManagedProcess, free_port


async def steady_load(url: str, until: float, streaming: bool, worker: int) -> list[tuple[int, bool]]:
    """Requests back to back until ``until``: (status, whether the answer ended properly) for each."""
    results = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        index = 0
        while time.monotonic() < until:
            body = chat(f"worker {worker} request {index}", 30, ignore_eos=True)
            if streaming:
                status, events = await stream(session, url, body)
                results.append((status, bool(events) and events[-1] == b"[DONE]"))
            else:
                status, _, reply = await post(session, url, body)
                results.append((status, reply["usage"]["completion_tokens"] == 30))
            index += 1
    return results


def in_flight(status: dict) -> int:
    return sum(backend["in_flight"] for backend in status["backends"])


async def backend_names(session: aiohttp.ClientSession, gateway: ManagedProcess) -> dict[str, bool]:
    status = await get_json(session, f"{gateway.url}/admin/backends")
    return {backend["name"]: backend["draining"] for backend in status["backends"]}


async def reload(session: aiohttp.ClientSession, gateway: ManagedProcess) -> tuple[int, dict]:
    status, _, body = await post(session, f"{gateway.url}/admin/reload", b"")
    return status, body


@pytest.mark.slow
async def test_reload_under_load_adds_drains_and_refuses_broken_configs(tmp_path: Path) -> None:
    with running(start_engines(tmp_path, 3, *SLOW_SIM)) as engines:
        config = gateway_config(free_port(), engines[:2])
        with gateway_for(tmp_path, config) as gateway:
            config_path = tmp_path / "gateway.yaml"
            url = f"{gateway.url}/v1/chat/completions"
            until = time.monotonic() + 4.0
            load = [asyncio.create_task(steady_load(url, until, i % 2 == 1, i)) for i in range(8)]
            async with aiohttp.ClientSession() as session:
                await wait_for_status(session, gateway.url, lambda status: in_flight(status) >= 4)
                swapped = gateway_config(config["listen"]["port"], engines, limits={"max_tokens": 32})
                swapped["backends"] = swapped["backends"][1:]
                write_config(config_path, swapped)
                status, body = await reload(session, gateway)
                assert status == 200 and body["backends"] == ["e1", "e2"]
                assert (await backend_names(session, gateway)).get("e0", True)

                write_config(config_path, {**swapped, "limits": {"max_tokens": "many"}, "surprise": 1})
                status, body = await reload(session, gateway)
                assert status == 400 and body["error"]["code"] == "invalid_config"
                assert (
                    "limits.max_tokens" in body["error"]["message"]
                    and "surprise: unknown key" in body["error"]["message"]
                )

                status, _, body = await post(session, url, chat("over the new limit", 40))
                assert status == 400 and body["error"]["code"] == "max_tokens_too_large"
                results = await asyncio.wait_for(asyncio.gather(*load), 40)
                # e0 drained its last request and left the pool
                await wait_for_status(session, gateway.url, lambda status: len(status["backends"]) == 2)
                assert await backend_names(session, gateway) == {"e1": False, "e2": False}

                drained = gateway_config(config["listen"]["port"], engines[:2])
                drained["backends"][1]["drain"] = True
                write_config(config_path, drained)
                os.kill(gateway.proc.pid, signal.SIGHUP)
                deadline = time.monotonic() + 10
                while "e0" not in await backend_names(session, gateway) and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                assert await backend_names(session, gateway) == {"e0": False, "e1": True}
                for index in range(3):
                    status, headers, _ = await post(session, url, chat(f"after drain {index}"))
                    assert status == 200 and headers["x-kvgate-backend"] == "e0"

                write_config(
                    config_path,
                    gateway_config(config["listen"]["port"], [engines[0]])
                    | {"backends": [{"name": "gone", "url": f"http://127.0.0.1:{free_port()}"}]},
                )
                assert (await reload(session, gateway))[0] == 200
                status, _, body = await post(session, url, chat("anyone there?"))
                assert status == 503 and body["error"]["code"] == "service_unavailable"

    outcomes = [outcome for worker in results for outcome in worker]
    assert outcomes and all(status == 200 and complete for status, complete in outcomes)


async def test_sigterm_drains_in_flight_streams(tmp_path: Path) -> None:
    with (
        running(start_engines(tmp_path, 1, *SLOW_SIM)) as engines,
        gateway_for(tmp_path, gateway_config(free_port(), engines)) as gateway,
    ):
        async with aiohttp.ClientSession() as session:
            url = f"{gateway.url}/v1/chat/completions"
            answer = asyncio.create_task(stream(session, url, chat("a long answer", 60, ignore_eos=True)))
            await wait_for_status(session, gateway.url, lambda status: in_flight(status) == 1)
            gateway.proc.send_signal(signal.SIGTERM)
            status, events = await asyncio.wait_for(answer, 30)
        assert status == 200 and events[-1] == b"[DONE]"
        assert len([event for event in events if isinstance(event, dict) and event.get("choices")]) >= 60
        assert await asyncio.to_thread(gateway.proc.wait, 30) == 0


ADMIN = {"Authorization": "Bearer admin-key"}
TENANT = {"Authorization": "Bearer tenant-key"}


async def reload_as_admin(session: aiohttp.ClientSession, gateway: ManagedProcess, query: str = "") -> tuple[int, dict]:
    status, _, body = await post(session, f"{gateway.url}/admin/reload{query}", b"", ADMIN)
    return status, body


async def test_a_reload_that_would_open_the_gateway_or_empty_it_is_refused(tmp_path: Path) -> None:
    """Truncated, empty and comment-only files, bad URLs, no backends, no tenants: the running config
    and its authentication stay unless the reload names the change in ``allow``."""
    with running(start_engines(tmp_path, 1, "--sim", "--sim-preset", "instant")) as engines:
        secured = gateway_config(
            free_port(),
            engines,
            tenants=[{"name": "team", "api_keys": ["tenant-key"]}],
            admin={"api_key": "admin-key"},
        )
        with gateway_for(tmp_path, secured) as gateway:
            config_path = tmp_path / "gateway.yaml"
            text = config_path.read_text()
            url = f"{gateway.url}/v1/chat/completions"
            async with aiohttp.ClientSession() as session:

                async def keyless_status() -> int:
                    return (await post(session, url, chat("who is there?")))[0]

                config_path.write_text(text[: text.index("tenants:")])
                status, body = await reload_as_admin(session, gateway)
                assert status == 400 and body["error"]["code"] == "unsafe_reload", body
                assert "allow=no_auth" in body["error"]["message"]
                os.kill(gateway.proc.pid, signal.SIGHUP)
                await asyncio.sleep(0.5)
                assert await keyless_status() == 401, "neither the endpoint nor SIGHUP turned auth off"

                cut_mid_line = text[: text.index("tenants:") + len("tenants:\n- api_")]
                for broken in ("", "\n\n", "# all commented out\n#backends: []\n", cut_mid_line):
                    config_path.write_text(broken)
                    status, body = await reload_as_admin(session, gateway, "?allow=no_backends,no_auth")
                    assert status == 400 and body["error"]["code"] == "invalid_config", (broken, body)

                bad_url = {**secured, "backends": [{"name": "e0", "url": "not a url"}]}
                write_config(config_path, bad_url)
                status, body = await reload_as_admin(session, gateway, "?allow=no_backends")
                assert status == 400 and "backends.0.url" in body["error"]["message"], body

                write_config(config_path, {**secured, "backends": []})
                status, body = await reload_as_admin(session, gateway, "?allow=no_auth")
                assert status == 400 and "allow=no_backends" in body["error"]["message"], body
                status, _, reply = await post(session, url, chat("still served?"), TENANT)
                assert status == 200, reply

                write_config(config_path, {key: value for key, value in secured.items() if key != "tenants"})
                status, body = await reload_as_admin(session, gateway, "?allow=no_auth")
                assert status == 200 and body["status"] == "reloaded", body
                assert await keyless_status() == 200, "an explicit allow=no_auth opens it"
