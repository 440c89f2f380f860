"""The prefill side's held transfers: which pinned blocks wait for which decode engine, until when.

A finished prefill whose request asked for remote decode pins its prompt's full blocks (the
block manager keeps a reference, so they cannot be evicted) and registers them here under a
transfer id. One pull serves a hold: ``start_pull`` marks it busy (the timeout leaves a busy hold
alone, so bytes are read only while pinned) and ``finish`` removes it; a hold nobody pulls is
removed by ``expired`` once its deadline passes. Whoever removes a hold unpins its blocks.

The engine thread adds holds and the event loop takes them, so every method takes a lock.
"""

import itertools
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class Hold:
    transfer_id: str
    block_ids: list[int]
    block_hashes: list[bytes]
    """The held blocks' hashes (16 bytes each): a pull names the ones it expects, so a decode
    engine whose prompt, salt, adapter or model name differs gets nothing it could misuse."""
    deadline: float
    """Monotonic time after which an unpulled hold is freed."""


class HoldRegistry:
    def __init__(self, engine_id: str, timeout_s: float) -> None:
        self.engine_id = engine_id
        self.timeout_s = timeout_s
        self._holds: dict[str, Hold] = {}
        self._busy: set[str] = set()
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._holds)

    @property
    def num_held_blocks(self) -> int:
        with self._lock:
            return sum(len(hold.block_ids) for hold in self._holds.values())

    def add(self, block_ids: list[int], block_hashes: list[bytes], now: float) -> str:
        """Register pinned blocks; returns the transfer id a decode engine pulls them by."""
        with self._lock:
            transfer_id = f"{self.engine_id}-{next(self._ids)}"
            self._holds[transfer_id] = Hold(transfer_id, block_ids, block_hashes, now + self.timeout_s)
            return transfer_id

    def start_pull(self, transfer_id: str) -> Hold | None:
        """The hold, now busy until ``finish``; None if unknown, expired or already being pulled."""
        with self._lock:
            hold = self._holds.get(transfer_id)
            if hold is None or transfer_id in self._busy:
                return None
            self._busy.add(transfer_id)
            return hold

    def finish(self, transfer_id: str) -> Hold | None:
        """Remove a hold (pulled, released by the decode side, or refused); None if already gone."""
        with self._lock:
            self._busy.discard(transfer_id)
            return self._holds.pop(transfer_id, None)

    def expired(self, now: float) -> list[Hold]:
        """Remove and return the holds past their deadline that no pull is reading."""
        with self._lock:
            gone = [hold for key, hold in self._holds.items() if hold.deadline <= now and key not in self._busy]
            for hold in gone:
                del self._holds[hold.transfer_id]
            return gone

    def drain(self) -> list[Hold]:
        """Remove every hold (shutdown)."""
        with self._lock:
            holds = list(self._holds.values())
            self._holds.clear()
            self._busy.clear()
            return holds
