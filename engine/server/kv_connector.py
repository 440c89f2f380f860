"""The bundled KV connector (``KvgateConnector``): disaggregated prefill and decode between engines.

Prefill side: a request with ``kv_transfer_params.do_remote_decode`` prefills as sent
(``max_tokens`` 1); when it finishes, the engine thread pins its prompt's full blocks and
registers them (``on_hold``); the answer's ``kv_transfer_params`` names them in vLLM's
NixlConnector shape. The pull server sends them to the decode engine that asks, then unpins
them; so does a release, and so does ``hold_timeout_s`` for a hold nobody pulls.

Decode side: a request with ``do_remote_prefill`` first asks the engine thread how many of its
prompt's leading full blocks it already holds (device prefix cache and host tier), pulls only
the rest, and has the engine install them (``RemoteKV``) before queueing the sequence, which
then hits them like any cached prefix. Any failure (peer gone, refused, mismatched, too slow)
leaves the sequence to prefill locally: the request never fails for it.
"""

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any

from prometheus_client import CollectorRegistry

from engine.core.kv_transfer_blocks import BlockIO
from engine.core.kv_transfer_config import KVTransferConfig
from engine.core.kv_transfer_types import KVHold, RemoteKV
from engine.core.llm_engine import LLMEngine
from engine.server.kv_transfer_client import PullFailed, PullTarget, pull_blocks, release_hold
from engine.server.kv_transfer_holds import HoldRegistry
from engine.server.kv_transfer_metrics import TransferMetrics
from engine.server.kv_transfer_params import TransferRequest
from engine.server.kv_transfer_server import PullServer

log = logging.getLogger(__name__)

_RELEASE_TIMEOUT_S = 2.0


class KvgateConnector:
    def __init__(self, config: KVTransferConfig, io: BlockIO, registry: CollectorRegistry, model_name: str) -> None:
        self.config = config
        self.io = io
        self.engine_id = config.engine_id or uuid.uuid4().hex[:16]
        self.holds = HoldRegistry(self.engine_id, config.hold_timeout_s)
        self.metrics = TransferMetrics(registry, model_name)
        self.metrics.track_held(lambda: self.holds.num_held_blocks)
        self.port = config.kv_port
        self._engine: LLMEngine | None = None
        self._server: PullServer | None = None
        self._expiry: asyncio.Task[None] | None = None
        self._releases: set[asyncio.Task[None]] = set()

    def attach(self, engine: LLMEngine) -> None:
        """Let the engine thread register holds with this connector."""
        self._engine = engine
        engine.on_hold = lambda block_ids, hashes: self.holds.add(block_ids, hashes, time.monotonic())
        engine.kv_io = self.io

    async def start(self) -> None:
        assert self._engine is not None, "attach() the engine first"
        self._server = PullServer(self.holds, self.io, self._engine.unpin_blocks, self.metrics)
        self.port = await self._server.start(self.config.kv_ip, self.config.kv_port)
        self._expiry = asyncio.create_task(self._expire_holds())
        log.info("KV connector %s (engine id %s) serving pulls on %s:%d",
                 self.config.kv_connector, self.engine_id, self.config.kv_ip, self.port)  # fmt: skip

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
        if self._server is not None:
            await self._server.stop()
        if self._engine is not None:
            for hold in self.holds.drain():
                self._engine.unpin_blocks(hold.block_ids)

    def prefill_answer(self, hold: KVHold | None) -> dict[str, Any]:
        """The prefill answer's ``kv_transfer_params`` (vLLM's NixlConnector fields)."""
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_request_id": hold.transfer_id if hold is not None else "",
            "remote_block_ids": hold.block_ids if hold is not None else [],
            "remote_host": self.config.kv_ip,
            "remote_port": self.port,
            "tp_size": 1,
        }

    async def fetch(self, request: TransferRequest, held: int, hashes: list[bytes]) -> RemoteKV | None:
        """Pull the blocks of ``hashes`` (the prompt's hit candidates) past the ``held`` ones this
        engine has; None when there is nothing to install (all held, or the pull failed)."""
        source = request.source
        if source is None:
            return None
        wanted = min(len(hashes), request.num_remote_blocks)
        if held >= wanted:
            if request.num_remote_blocks:
                self._release_later(source)
            return None
        try:
            payload = await pull_blocks(
                source, held, hashes[held:wanted], self.io.layout, self.io.bytes_per_block, self.config.pull_timeout_s
            )
        except PullFailed as exc:
            log.warning("KV pull of %s failed, prefilling locally: %s", source.transfer_id, exc)
            self.metrics.fallbacks[exc.reason].inc()
            self._release_later(source)
            return None
        except asyncio.CancelledError:
            self._release_later(source)
            raise
        count = wanted - held
        self.metrics.moved("pulled", count, count * self.io.bytes_per_block)
        return RemoteKV(held, count, payload)

    def _release_later(self, source: PullTarget) -> None:
        """Free the prefill side's hold without making the request wait for it."""
        task = asyncio.get_running_loop().create_task(release_hold(source, _RELEASE_TIMEOUT_S))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _expire_holds(self) -> None:
        interval = min(1.0, self.config.hold_timeout_s / 4)
        assert self._engine is not None
        while True:
            await asyncio.sleep(interval)
            for hold in self.holds.expired(time.monotonic()):
                log.info("KV transfer %s was not pulled within %s s; freeing its %d blocks",
                         hold.transfer_id, self.config.hold_timeout_s, len(hold.block_ids))  # fmt: skip
                self.metrics.holds_expired.inc()
                self._engine.unpin_blocks(hold.block_ids)
