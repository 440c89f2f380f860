"""Pushes the engine's load to every gateway: a ZMQ PUB socket, one message every ``interval_s``
and one as soon as new requests are queued.

Each message is one msgpack ``ReplicaLoad`` (protocol/replica_stats.py) in a single frame. Load rides a socket of its own rather than
the KV-event stream: that stream keeps vLLM's exact format (consumers built for vLLM decode its
events strictly), and load is a latest-value signal where a lost message costs little, while a
lost KV event costs a replay. Each message also announces the prompts queued since the one
before (``pending_prefixes``), so every gateway knows the prefixes the replica is about to cache.
"""

import contextlib
import threading
from collections.abc import Callable

import zmq

from protocol.replica_stats import ReplicaLoad, encode_load

DEFAULT_INTERVAL_S = 0.05


class LoadPublisher:
    """Binds at ``endpoint`` now (so a bad endpoint fails start-up) and publishes from its own thread."""

    def __init__(
        self, endpoint: str, read_load: Callable[[], ReplicaLoad], interval_s: float = DEFAULT_INTERVAL_S
    ) -> None:
        self._socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(endpoint)
        self._read_load = read_load
        self.interval_s = interval_s
        self._stopping = threading.Event()
        self._nudged = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-publisher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def nudge(self) -> None:
        """Publish now rather than at the next tick (new requests queued: other gateways should know)."""
        self._nudged.set()

    def stop(self) -> None:
        self._stopping.set()
        self._nudged.set()
        if self._thread.is_alive():
            self._thread.join()
        self._socket.close()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._nudged.wait(self.interval_s)
            self._nudged.clear()
            with contextlib.suppress(zmq.Again):
                self._socket.send(encode_load(self._read_load()), zmq.NOBLOCK)
