"""A gateway in front of simulated engines, all real processes on loopback, for admission and fault tests."""

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from tests.bodies import MODEL as MODEL
from tests.bodies import chat as chat
from tests.procs import HttpReply, ManagedProcess, free_port, http, start_engine, start_gateway

INSTANT_SIM = ("--sim", "--sim-preset", "instant")
"""A simulated engine that answers at once."""
SLOW_SIM = ("--sim", "--sim-preset", "instant", "--sim-decode-base-s", "0.02")
"""A simulated engine that emits about 50 tokens a second: streams long enough to interrupt."""


def start_engines(tmp_path: Path, count: int, *flags: str) -> list[ManagedProcess]:
    """``count`` engines started in parallel (each takes seconds to load its tokenizer)."""
    return start_engine_set(tmp_path, [flags] * count)


def start_engine_set(tmp_path: Path, flag_sets: Sequence[Sequence[str]]) -> list[ManagedProcess]:
    """One engine per entry of ``flag_sets``, started in parallel; if one fails, the others are stopped."""
    return start_all(
        [partial(start_engine, tmp_path, *flags, name=f"engine{index}") for index, flags in enumerate(flag_sets)]
    )


def start_all(starters: Sequence[Callable[[], ManagedProcess]]) -> list[ManagedProcess]:
    """Each starter's process, started in parallel; if one fails, the others are stopped."""
    with ThreadPoolExecutor(len(starters)) as pool:
        futures = [pool.submit(starter) for starter in starters]
    started = [future.result() for future in futures if future.exception() is None]
    errors = [error for future in futures if (error := future.exception()) is not None]
    if errors:
        for process in started:
            process.stop()
        raise errors[0]
    return started


def start_publishing_engines(tmp_path: Path, count: int, *flags: str) -> tuple[list[ManagedProcess], list[str]]:
    """``count`` engines publishing KV events, and their endpoints: several gateways need precise mode."""
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(count)]
    with ThreadPoolExecutor(count) as pool:
        engines = pool.map(
            lambda index: start_engine(tmp_path, *flags, "--kv-events", endpoints[index], name=f"engine{index}"),
            range(count),
        )
        return list(engines), endpoints


def precise_backends(engines: list[ManagedProcess], kv_events: list[str]) -> list[dict[str, str]]:
    """Backends e0, e1, ... that the gateway follows by their KV events."""
    return [
        {"name": f"e{index}", "url": engine.url, "kv_events": endpoint}
        for index, (engine, endpoint) in enumerate(zip(engines, kv_events, strict=True))
    ]


def gateway_config(
    port: int, engines: list[ManagedProcess], *, every_backend: dict[str, Any] | None = None, **sections: Any
) -> dict[str, Any]:
    """A gateway config for ``engines`` (backends e0, e1, ..., each with ``every_backend``'s fields) with fast
    health checks, and ``sections`` in place of the defaults."""
    backends = [
        {"name": f"e{index}", "url": engine.url, **(every_backend or {})} for index, engine in enumerate(engines)
    ]
    config: dict[str, Any] = {
        "listen": {"port": port},
        "model": MODEL,
        "backends": backends,
        "routing": {"policy": "least_loaded"},
        "health": {"interval_s": 0.5, "timeout_s": 1.0},
    }
    config.update(sections)
    return config


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


@contextmanager
def running(processes: list[ManagedProcess]) -> Iterator[list[ManagedProcess]]:
    try:
        yield processes
    finally:
        for process in processes:
            process.stop()


@contextmanager
def gateway_for(tmp_path: Path, config: dict[str, Any]) -> Iterator[ManagedProcess]:
    config_path = write_config(tmp_path / "gateway.yaml", config)
    gateway = start_gateway(tmp_path, config_path, config["listen"]["port"])
    try:
        yield gateway
    finally:
        gateway.stop()


@contextmanager
def gateways_for(tmp_path: Path, configs: dict[str, dict[str, Any]]) -> Iterator[dict[str, ManagedProcess]]:
    """A gateway per named config (its config and log in ``tmp_path / name``), started in parallel."""

    def starter(name: str, config: dict[str, Any]) -> Callable[[], ManagedProcess]:
        folder = tmp_path / name
        folder.mkdir(exist_ok=True)
        config_path = write_config(folder / "gateway.yaml", config)
        return partial(start_gateway, folder, config_path, config["listen"]["port"])

    with running(start_all([starter(name, config) for name, config in configs.items()])) as gateways:
        yield dict(zip(configs, gateways, strict=True))


@contextmanager
def gateway_with_engines(
    tmp_path: Path,
    engines: Sequence[Sequence[str]] = (INSTANT_SIM,),
    *,
    every_backend: dict[str, Any] | None = None,
    **sections: Any,
) -> Iterator[ManagedProcess]:
    """A gateway (``gateway_config`` with ``every_backend`` and ``sections``) in front of fresh engines, one per
    entry of ``engines`` (its flags); all of them stop on exit."""
    with running(start_engine_set(tmp_path, engines)) as started:
        config = gateway_config(free_port(), started, every_backend=every_backend, **sections)
        with gateway_for(tmp_path, config) as gateway:
            yield gateway


def post_chat(gateway: ManagedProcess, body: dict[str, Any], headers: dict[str, str] | None = None) -> HttpReply:
    """POST a chat completion to the gateway; it must succeed."""
    reply = http("POST", f"{gateway.url}/v1/chat/completions", body, headers)
    assert reply.status == 200, reply.body
    return reply


async def post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any] | bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    """POST and return (status, headers, parsed JSON body or raw bytes)."""
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with session.post(url, data=data, headers={"Content-Type": "application/json", **(headers or {})}) as reply:
        raw = await reply.read()
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            parsed = raw
        return reply.status, dict(reply.headers), parsed


async def stream(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, list[Any]]:
    """POST a streaming request; return the status and every SSE data payload (parsed, or b"[DONE]")."""
    async with session.post(url, json={**body, "stream": True}, headers=headers) as reply:
        if reply.status != 200:
            return reply.status, [await reply.json(content_type=None)]
        events: list[Any] = []
        async for line in reply.content:
            if line.startswith(b"data: "):
                payload = line[6:].strip()
                events.append(payload if payload == b"[DONE]" else orjson.loads(payload))
        return reply.status, events


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as reply:
        return await reply.json(content_type=None)


async def wait_for_status(
    session: aiohttp.ClientSession, gateway_url: str, condition: Callable[[dict[str, Any]], bool], timeout_s: float = 10
) -> dict[str, Any]:
    """Poll /admin/backends until ``condition`` holds; the last status otherwise fails the test."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = await get_json(session, f"{gateway_url}/admin/backends")
        if condition(status):
            return status
        assert time.monotonic() < deadline, f"condition never held: {status}"
        await asyncio.sleep(0.02)


def logged_lines(
    log_text: Callable[[], str], matches: Callable[[dict[str, Any]], bool], timeout_s: float = 10.0
) -> list[dict[str, Any]]:
    """The request log's JSON lines that match, once there is one (empty after ``timeout_s``): a
    request's line is written as its handler ends, which may be after the client has its whole answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [orjson.loads(line) for line in log_text().splitlines() if line.startswith("{")]
        found = [line for line in lines if matches(line)]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)
