"""Reading and writing whole KV blocks as bytes, for the KV connector; the simulated kind.

A ``BlockIO`` knows its pool's ``layout`` (dtype and shape of one block: two engines exchange
blocks only when theirs are equal) and ``bytes_per_block``. ``read`` runs off the engine thread
on pinned blocks (nothing writes them while pinned); ``write`` runs on the engine thread between
steps. The torch one is in ``engine/server/kv_transfer_torch.py``, so a ``--sim`` engine never imports torch.
"""

from typing import Protocol


class BlockIO(Protocol):
    layout: str
    bytes_per_block: int

    def read(self, block_ids: list[int]) -> bytes:
        """The blocks' K/V (every layer), block after block, ``bytes_per_block`` each."""
        ...

    def write(self, block_ids: list[int], payload: bytes, rows: list[int]) -> None:
        """Store row ``rows[i]`` of ``payload`` (a ``read`` result) into device block ``block_ids[i]``."""
        ...

    def wire_seconds(self, num_blocks: int) -> float:
        """Extra time a transfer of ``num_blocks`` takes beyond moving the payload (the simulated wire)."""
        ...


class SimBlockIO:
    """A ``--sim`` engine's blocks carry no bytes; moving them takes their size over a bandwidth."""

    def __init__(self, bytes_per_token: int, block_size: int, bandwidth_gbs: float) -> None:
        self.bytes_per_block = bytes_per_token * block_size
        self.layout = f"sim:{bytes_per_token}B/token:{block_size}"
        self.bandwidth_bytes_per_s = bandwidth_gbs * 1e9

    def read(self, block_ids: list[int]) -> bytes:
        return b""

    def write(self, block_ids: list[int], payload: bytes, rows: list[int]) -> None:
        return None

    def wire_seconds(self, num_blocks: int) -> float:
        return num_blocks * self.bytes_per_block / self.bandwidth_bytes_per_s
