"""The load generator: sends a workload's requests, streamed, and times each one.

Open loop: every session (a single request, or one user's turns in order) starts at its
requests' arrival times, whatever the system under test does. Closed loop: ``users`` workers each
take the next whole session and send its turns back to back (plus think time), ignoring arrival
times. Per request it records TTFT, inter-token latencies, end-to-end latency, prompt and cached
tokens (``usage.prompt_tokens_details.cached_tokens``), the backend that served it and the status.
"""

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from tqdm import tqdm

from bench.workloads.types import BenchRequest


@dataclass(frozen=True)
class Target:
    """Where requests go: one router URL, or several replica URLs the client itself round-robins."""

    urls: tuple[str, ...]
    model: str
    detokenize: Callable[[Sequence[int]], str] | None = None
    """Set when the target takes text prompts only: token-id prompts are sent as their text."""


@dataclass
class RequestResult:
    request_id: str
    group: str
    start_s: float
    """When it was sent, from the start of the run."""
    status: int = 0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    backend: str | None = None
    route_reason: str | None = None
    """kvgate's ``x-kvgate-route-reason`` (prefix-hit, load-spill, ...), when the target sends it."""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and self.ttft_s is not None

    @property
    def ttft(self) -> float:
        """``ttft_s`` of a request that got its first token (every ``ok`` one)."""
        if self.ttft_s is None:
            raise ValueError(f"{self.request_id} got no first token")
        return self.ttft_s

    @property
    def e2e(self) -> float:
        """``e2e_s`` of a request that finished."""
        if self.e2e_s is None:
            raise ValueError(f"{self.request_id} did not finish")
        return self.e2e_s


@dataclass
class LoadResult:
    results: list[RequestResult]
    duration_s: float


def request_body(request: BenchRequest, target: Target) -> tuple[str, dict[str, Any]]:
    """The endpoint path and JSON body of one request for this target."""
    body: dict[str, Any] = {
        "model": target.model,
        "max_tokens": request.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.user is not None:
        body["user"] = request.user
    if request.messages is not None:
        return "/v1/chat/completions", {**body, "messages": list(request.messages)}
    assert request.prompt_ids is not None
    prompt: str | list[int] = target.detokenize(request.prompt_ids) if target.detokenize else list(request.prompt_ids)
    return "/v1/completions", {**body, "prompt": prompt}


async def run_load(
    requests: Sequence[BenchRequest],
    target: Target,
    users: int | None = None,
    request_timeout_s: float = 300.0,
    label: str = "load",
) -> LoadResult:
    """Send every request (open loop, or closed loop with ``users`` workers) and time each."""
    sessions = sessions_of(requests)
    urls = itertools.cycle(target.urls)
    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    results: list[RequestResult] = []
    with tqdm(total=len(requests), desc=label, unit="req", leave=False) as progress:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as http:
            started = time.perf_counter()

            async def run_session(session: list[BenchRequest], use_arrivals: bool) -> None:
                previous_end = 0.0
                for request in session:
                    ready = previous_end + request.think_s
                    if use_arrivals:
                        ready = max(ready, request.arrival_s)
                    await asyncio.sleep(max(0.0, ready - (time.perf_counter() - started)))
                    result = await send(http, next(urls), request, target, started)
                    results.append(result)
                    progress.update()
                    previous_end = time.perf_counter() - started

            if users is None:
                await asyncio.gather(*(run_session(session, True) for session in sessions))
            else:
                queue = list(reversed(sessions))

                async def worker() -> None:
                    while queue:
                        await run_session(queue.pop(), False)

                await asyncio.gather(*(worker() for _ in range(users)))
            duration = time.perf_counter() - started
    return LoadResult(sorted(results, key=lambda result: result.start_s), duration)


def sessions_of(requests: Sequence[BenchRequest]) -> list[list[BenchRequest]]:
    """Requests grouped by session, each in order, sessions by their first arrival."""
    by_session: dict[str, list[BenchRequest]] = {}
    for request in sorted(requests, key=lambda request: request.arrival_s):
        by_session.setdefault(request.session_id, []).append(request)
    return list(by_session.values())


async def send(
    http: aiohttp.ClientSession, url: str, request: BenchRequest, target: Target, run_started: float
) -> RequestResult:
    path, body = request_body(request, target)
    sent = time.perf_counter()
    result = RequestResult(request.request_id, request.group, start_s=sent - run_started)
    try:
        async with http.post(
            url + path,
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json", "x-request-id": request.request_id},
        ) as response:
            result.status = response.status
            result.backend = response.headers.get("x-kvgate-backend") or (url if len(target.urls) > 1 else None)
            result.route_reason = response.headers.get("x-kvgate-route-reason")
            if response.status != 200:
                result.error = (await response.text())[:300]
                return result
            await _read_stream(response, result, sent)
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def _read_stream(response: aiohttp.ClientResponse, result: RequestResult, sent: float) -> None:
    last_token_at: float | None = None
    async for line in response.content:
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        chunk = orjson.loads(payload)
        if "error" in chunk:
            result.error = str(chunk["error"].get("message", chunk["error"]))[:300]
            return
        now = time.perf_counter()
        if _has_text(chunk):
            if last_token_at is None:
                result.ttft_s = now - sent
            else:
                result.itl_s.append(now - last_token_at)
            last_token_at = now
            result.output_tokens += 1
        usage = chunk.get("usage")
        if usage:
            result.prompt_tokens = usage.get("prompt_tokens", 0)
            result.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            result.output_tokens = usage.get("completion_tokens", result.output_tokens)
    result.e2e_s = time.perf_counter() - sent


def _has_text(chunk: dict[str, Any]) -> bool:
    for choice in chunk.get("choices") or ():
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False
