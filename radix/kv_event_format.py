"""vLLM's KV-event wire format, written by the engine and read by the gateway.

Over ZMQ PUB each message has three frames: ``[topic, sequence (8-byte big-endian), payload]``;
sequence numbers start at 0 (vLLM's ``ZmqEventPublisher`` counts with ``itertools.count()``).
The payload is msgpack ``[timestamp, [event, ...], data_parallel_rank]``. Current vLLM encodes
each event as a map with a ``type`` key (vllm-project/vllm#42892); older releases as a positional
array whose first item is the type name. We write maps and read both, and a batch written as a map
too. Block hashes are opaque to a consumer: on the wire vLLM sends 64-bit unsigned ints, the last 8
bytes of its sha256 block hash (``maybe_convert_block_hash`` in ``vllm/v1/core/kv_cache_utils.py``,
on by default through ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``); the bundled engine converts its
128-bit hashes the same way (``wire_block_hash``). Older kvgate engines sent 16 bytes, which we
still read. Consumers re-derive their own hashes from token ids; vLLM's ``extra_keys`` carries what
else went into a block's hash (the LoRA name on every block, the cache salt on a prompt's first).
"""

import struct
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

ExternalBlockHash = bytes | int
WIRE_HASH_MASK = (1 << 64) - 1
MEDIUM_GPU = "GPU"
"""The device pool (vLLM's name for it, whatever the accelerator)."""
MEDIUM_CPU = "CPU"
"""Host memory (vLLM's CPU offloading, the bundled engine's host tier)."""


@dataclass
class BlockStored:
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = MEDIUM_GPU
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    """Per block, what else its hash covers (vLLM: LoRA name, multimodal hashes, the cache salt on
    a prompt's first block), or None."""


@dataclass
class BlockRemoved:
    block_hashes: list[ExternalBlockHash]
    medium: str | None = MEDIUM_GPU


@dataclass
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared

_EVENT_TYPES: dict[str, type] = {cls.__name__: cls for cls in (BlockStored, BlockRemoved, AllBlocksCleared)}
_POSITIONAL_FIELDS: dict[str, tuple[str, ...]] = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
    ),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


@dataclass
class EventBatch:
    ts: float
    events: list[KVEvent] = field(default_factory=list)
    data_parallel_rank: int | None = None


def encode_batch(batch: EventBatch) -> bytes:
    """msgpack payload of one batch, events as maps with a ``type`` key."""
    events = [{"type": type(event).__name__, **event.__dict__} for event in batch.events]
    return _encoder.encode([batch.ts, events, batch.data_parallel_rank])


def decode_batch(payload: bytes) -> EventBatch:
    """Read a payload in either the map or the positional encoding, of the batch and of its events.

    Raises ``ValueError`` for a payload that is not an event batch; unknown event types are
    skipped so that a newer publisher does not break an older consumer.
    """
    try:
        raw = _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise ValueError(f"KV event payload is not msgpack: {exc}") from exc
    if isinstance(raw, dict):
        raw = [raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")]
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise ValueError("KV event payload is not [ts, events, ...]")
    if not isinstance(raw[0], int | float):
        raise ValueError("KV event batch timestamp is not a number")
    rank = raw[2] if len(raw) > 2 else None
    events = [event for event in (_decode_event(item) for item in raw[1]) if event is not None]
    return EventBatch(float(raw[0]), events, rank)


def wire_block_hash(block_hash: ExternalBlockHash) -> int:
    """The 64-bit unsigned int vLLM publishes for a block hash: its last 8 bytes, big-endian
    (``int.from_bytes(hash_bytes, "big") & ((1 << 64) - 1)``, vLLM's ``maybe_convert_block_hash``)."""
    value = int.from_bytes(block_hash, "big") if isinstance(block_hash, bytes) else block_hash
    return value & WIRE_HASH_MASK


def to_wire(event: KVEvent) -> KVEvent:
    """The event with its block hashes as vLLM publishes them (64-bit ints)."""
    if isinstance(event, BlockStored):
        parent = event.parent_block_hash
        return replace(
            event,
            block_hashes=[wire_block_hash(block_hash) for block_hash in event.block_hashes],
            parent_block_hash=None if parent is None else wire_block_hash(parent),
        )
    if isinstance(event, BlockRemoved):
        return replace(event, block_hashes=[wire_block_hash(block_hash) for block_hash in event.block_hashes])
    return event


def _decode_event(item: Any) -> KVEvent | None:
    if isinstance(item, dict):
        name = item.get("type")
        fields = {key: value for key, value in item.items() if key != "type"}
    elif isinstance(item, list) and item and isinstance(item[0], str):
        name = item[0]
        fields = dict(zip(_POSITIONAL_FIELDS.get(name, ()), item[1:], strict=False))
    else:
        return None
    cls = _EVENT_TYPES.get(name) if isinstance(name, str) else None
    if cls is None or not isinstance(name, str):
        return None
    known = _POSITIONAL_FIELDS[name]
    return cls(**{key: value for key, value in fields.items() if key in known})


def frames(topic: str, sequence: int, batch: EventBatch) -> list[bytes]:
    """The three ZMQ frames of one published batch."""
    return [topic.encode(), struct.pack(">Q", sequence), encode_batch(batch)]


def parse_frames(parts: list[bytes]) -> tuple[int, EventBatch]:
    """Sequence number and batch from received frames (the topic frame is optional)."""
    if len(parts) < 2:
        raise ValueError(f"KV event message has {len(parts)} frames, expected 2 or 3")
    sequence_frame, payload = parts[-2], parts[-1]
    if len(sequence_frame) != 8:
        raise ValueError("KV event sequence frame is not 8 bytes")
    return struct.unpack(">Q", sequence_frame)[0], decode_batch(payload)
