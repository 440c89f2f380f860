"""A worker's client for its siblings' private sockets (see gateway/process/workers/private_app.py)."""

import asyncio
import logging

import aiohttp

from gateway.process.workers.identity import WorkerIdentity

log = logging.getLogger("kvgate.workers")

SIBLING_TIMEOUT = aiohttp.ClientTimeout(total=10)


class Siblings:
    def __init__(self, identity: WorkerIdentity) -> None:
        self.identity = identity
        self._sessions: dict[int, aiohttp.ClientSession] = {}

    async def call(self, method: str, path: str) -> dict[int, tuple[int, bytes] | None]:
        """``method path`` on every sibling at once: its (status, body), or None if it did not answer
        (a worker that is restarting)."""
        indexes = self.identity.siblings
        replies = await asyncio.gather(*(self._call(index, method, path) for index in indexes))
        return dict(zip(indexes, replies, strict=True))

    async def bodies(self, path: str) -> list[bytes]:
        """The bodies of the siblings that answered ``GET path`` with 200."""
        replies = await self.call("GET", path)
        return [reply[1] for reply in replies.values() if reply is not None and reply[0] == 200]

    async def _call(self, index: int, method: str, path: str) -> tuple[int, bytes] | None:
        session = self._session(index)
        try:
            async with session.request(method, f"http://worker{path}") as response:
                return response.status, await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("worker %d did not answer %s %s: %s", index, method, path, exc or type(exc).__name__)
            return None

    def _session(self, index: int) -> aiohttp.ClientSession:
        if index not in self._sessions:
            connector = aiohttp.UnixConnector(path=str(self.identity.socket_path(index)))
            self._sessions[index] = aiohttp.ClientSession(connector=connector, timeout=SIBLING_TIMEOUT)
        return self._sessions[index]

    async def close(self) -> None:
        await asyncio.gather(*(session.close() for session in self._sessions.values()))
