"""The decode side's pulls: ask a prefill engine's pull server for blocks, or release a hold."""

import asyncio
import contextlib
from dataclasses import dataclass

from engine.server.kv_transfer_wire import PullReply, PullRequest, WireError, encode, read_reply


class PullFailed(Exception):
    """The pull brought nothing usable; ``reason`` is one of ``kv_transfer_metrics.FALLBACKS``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class PullTarget:
    host: str
    port: int
    transfer_id: str


async def pull_blocks(
    target: PullTarget,
    first: int,
    block_hashes: list[bytes],
    layout: str,
    bytes_per_block: int,
    timeout_s: float,
) -> bytes:
    """The bytes of the held blocks ``first .. first + len(block_hashes)``, checked against this
    engine's layout and block size; raises ``PullFailed`` on anything else. Cancelling it closes
    the connection, which makes the prefill side free the hold."""
    request = PullRequest("pull", target.transfer_id, first, len(block_hashes), block_hashes, layout)
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await _connect(target)
            try:
                writer.write(encode(request))
                await writer.drain()
                reply = await read_reply(reader)
                _check(reply, layout, bytes_per_block, len(block_hashes))
                return await reader.readexactly(reply.payload_bytes)
            finally:
                writer.close()
    except TimeoutError:
        raise PullFailed("timeout", f"no blocks from {target.host}:{target.port} within {timeout_s} s") from None
    except (WireError, ConnectionError, asyncio.IncompleteReadError) as exc:
        raise PullFailed("error", f"the pull from {target.host}:{target.port} broke: {exc!r}") from None


async def release_hold(target: PullTarget, timeout_s: float) -> None:
    """Tell the prefill engine to free a hold this engine will not pull (best effort: a hold
    nobody releases is freed by its timeout)."""
    with contextlib.suppress(OSError, TimeoutError, WireError, asyncio.IncompleteReadError):
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(target.host, target.port)
            try:
                writer.write(encode(PullRequest("release", target.transfer_id)))
                await writer.drain()
                await read_reply(reader)
            finally:
                writer.close()


async def _connect(target: PullTarget) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        return await asyncio.open_connection(target.host, target.port)
    except OSError as exc:
        raise PullFailed("unreachable", f"{target.host}:{target.port}: {exc}") from None


def _check(reply: PullReply, layout: str, bytes_per_block: int, count: int) -> None:
    if not reply.ok:
        reason = "mismatch" if "differ" in reply.error else "refused"
        raise PullFailed(reason, reply.error)
    if reply.layout != layout or reply.bytes_per_block != bytes_per_block or reply.count != count:
        raise PullFailed("mismatch", f"sent {reply.count} blocks of {reply.layout}, this engine has {layout}")
    expected = 0 if layout.startswith("sim:") else count * bytes_per_block
    if reply.payload_bytes != expected:
        raise PullFailed("mismatch", f"{reply.payload_bytes} payload bytes for {count} blocks of {bytes_per_block}")
