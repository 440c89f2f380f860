"""What the engine loop and the KV connector hand each other."""

from dataclasses import dataclass


@dataclass(frozen=True)
class KVHold:
    """A finished prefill's pinned blocks, registered for a decode engine to pull."""

    transfer_id: str
    block_ids: list[int]


@dataclass(frozen=True)
class RemoteKV:
    """Blocks ``first .. first + count`` of a prompt, pulled from a prefill engine, to install
    before the sequence is queued; ``payload`` holds their bytes (empty for ``--sim``)."""

    first: int
    count: int
    payload: bytes
