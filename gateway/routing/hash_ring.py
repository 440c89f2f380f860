"""Consistent-hash ring: a key keeps its replica while replicas come and go elsewhere."""

from bisect import bisect_left

import xxhash


class HashRing:
    """``vnodes`` points per replica on a 64-bit ring; a key belongs to the next point clockwise."""

    def __init__(self, names: list[str], vnodes: int) -> None:
        points = sorted((xxhash.xxh64_intdigest(f"{name}#{i}".encode()), name) for name in names for i in range(vnodes))
        self._positions = [position for position, _ in points]
        self._owners = [name for _, name in points]
        self.names = frozenset(names)

    def walk(self, key: str) -> list[str]:
        """Every replica once, in ring order from the key's point: the owner first, then its fallbacks."""
        if not self._owners:
            return []
        start = bisect_left(self._positions, xxhash.xxh64_intdigest(key.encode()))
        ordered = self._owners[start:] + self._owners[:start]
        return list(dict.fromkeys(ordered))
