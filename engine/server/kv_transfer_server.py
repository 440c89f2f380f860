"""The prefill side's pull server: a small asyncio TCP server on ``kv_ip:kv_port``.

Each connection carries one ``PullRequest``. A pull of a held transfer whose hashes and layout
match gets its blocks (read while still pinned, off the event loop); whatever happens next (sent,
refused, connection broken, decode side cancelled), the hold is finished and its blocks unpinned.
A release finishes the hold at once.
"""

import asyncio
import logging
from collections.abc import Callable

from engine.core.kv_transfer_blocks import BlockIO
from engine.server.kv_transfer_holds import Hold, HoldRegistry
from engine.server.kv_transfer_metrics import TransferMetrics
from engine.server.kv_transfer_wire import PullReply, PullRequest, WireError, encode, read_request

log = logging.getLogger(__name__)

_REQUEST_TIMEOUT_S = 10.0
"""How long a connection may take to send its request."""


class PullServer:
    def __init__(
        self,
        registry: HoldRegistry,
        io: BlockIO,
        unpin: Callable[[list[int]], None],
        metrics: TransferMetrics,
    ) -> None:
        self.registry = registry
        self.io = io
        self.unpin = unpin
        """Hands the blocks back to the engine thread (the block manager drops its pin)."""
        self.metrics = metrics
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the port (the one chosen when ``port`` is 0)."""
        self._server = await asyncio.start_server(self._serve, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def finish(self, transfer_id: str) -> None:
        hold = self.registry.finish(transfer_id)
        if hold is not None:
            self.unpin(hold.block_ids)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(read_request(reader), _REQUEST_TIMEOUT_S)
            if request.op == "release":
                self.finish(request.transfer_id)
                writer.write(encode(PullReply(ok=True)))
            elif request.op == "pull":
                await self._pull(request, writer)
            else:
                writer.write(encode(PullReply(ok=False, error=f"unknown op {request.op!r}")))
            await writer.drain()
        except (WireError, ConnectionError, asyncio.IncompleteReadError, TimeoutError) as exc:
            log.info("KV pull connection ended early: %s", exc)
        finally:
            writer.close()

    async def _pull(self, request: PullRequest, writer: asyncio.StreamWriter) -> None:
        hold = self.registry.start_pull(request.transfer_id)
        if hold is None:
            writer.write(encode(PullReply(ok=False, error=f"no transfer {request.transfer_id!r} is held here")))
            return
        try:
            error = self._mismatch(request, hold)
            if error:
                writer.write(encode(PullReply(ok=False, error=error)))
                return
            block_ids = hold.block_ids[request.first : request.first + request.count]
            payload = await asyncio.to_thread(self.io.read, block_ids)
            await asyncio.sleep(self.io.wire_seconds(request.count))
            reply = PullReply(True, "", self.io.layout, self.io.bytes_per_block, request.count, len(payload))
            writer.write(encode(reply))
            writer.write(payload)
            await writer.drain()
            self.metrics.moved("served", request.count, request.count * self.io.bytes_per_block)
        finally:
            self.finish(request.transfer_id)

    def _mismatch(self, request: PullRequest, hold: Hold) -> str:
        """Why these blocks must not go to this puller ("" when they may)."""
        if request.layout != self.io.layout:
            return f"KV layout differs: this engine's is {self.io.layout}, the puller's {request.layout}"
        end = request.first + request.count
        if request.first < 0 or request.count <= 0 or end > len(hold.block_ids):
            return f"blocks {request.first}..{end} are not all held ({len(hold.block_ids)} are)"
        if list(request.block_hashes) != hold.block_hashes[request.first : end]:
            return "block hashes differ: the prompt, cache salt, adapter or model name is not the one prefilled"
        return ""
