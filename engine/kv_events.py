"""Publishes the block manager's KV events over ZMQ PUB in vLLM's wire format."""

import time

import zmq

from radix.kv_event_format import EventBatch, KVEvent, frames

DEFAULT_TOPIC = "kv-events"


class KVEventPublisher:
    """Binds a PUB socket at ``endpoint``; ``publish`` sends one batch per engine step.

    The socket is used from the engine thread only (ZMQ sockets are not thread-safe).
    """

    def __init__(self, endpoint: str, topic: str = DEFAULT_TOPIC) -> None:
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(endpoint)
        self.topic = topic
        self._sequence = 0

    def publish(self, events: list[KVEvent]) -> None:
        if not events:
            return
        self._socket.send_multipart(frames(self.topic, self._sequence, EventBatch(time.time(), events)))
        self._sequence += 1

    def close(self) -> None:
        self._socket.close()
