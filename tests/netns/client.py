"""The client host of the network test: waits until every gateway has a healthy replica, then sends its requests.

Run inside the client's namespace: ``python -m tests.netns.client '{"ready": [...], "requests": [...]}'``;
each request is ``{"url", "key", "body"}``, all sent at once. Prints one JSON line: per request
its status, error code and the backend that served it.
"""

import asyncio
import sys
import time
from typing import Any

import aiohttp
import orjson

READY_TIMEOUT_S = 120.0


async def wait_ready(session: aiohttp.ClientSession, url: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            async with session.get(f"{url}/health") as reply:
                if reply.status == 200 and (await reply.json())["healthy_backends"]:
                    return
        except (aiohttp.ClientError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not ready after {READY_TIMEOUT_S} s")
        await asyncio.sleep(0.2)


async def send(session: aiohttp.ClientSession, request: dict[str, Any]) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {request['key']}"}
    async with session.post(f"{request['url']}/v1/chat/completions", json=request["body"], headers=headers) as reply:
        body = orjson.loads(await reply.read())
        code = body["error"]["code"] if "error" in body else None
        return {"status": reply.status, "code": code, "backend": reply.headers.get("x-kvgate-backend")}


async def main(spec: dict[str, Any]) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        await asyncio.gather(*(wait_ready(session, url) for url in spec["ready"]))
        return list(await asyncio.gather(*(send(session, request) for request in spec["requests"])))


if __name__ == "__main__":
    print(orjson.dumps(asyncio.run(main(orjson.loads(sys.argv[1])))).decode())
