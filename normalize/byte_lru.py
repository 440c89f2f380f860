"""A least-recently-used map bounded by the bytes its values hold, not by their count."""

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ByteLRU(Generic[K, V]):
    """Invariant: ``bytes`` is the sum of ``sizeof`` over the values held and never exceeds
    ``capacity_bytes``; a value larger than the capacity is not stored."""

    def __init__(self, capacity_bytes: int, sizeof: Callable[[V], int]) -> None:
        self.capacity_bytes = capacity_bytes
        self.bytes = 0
        self._sizeof = sizeof
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: K, value: V) -> None:
        size = self._sizeof(value)
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        if size > self.capacity_bytes:
            return
        while self.bytes + size > self.capacity_bytes:
            _, (_, evicted_size) = self._entries.popitem(last=False)
            self.bytes -= evicted_size
        self._entries[key] = (value, size)
        self.bytes += size
