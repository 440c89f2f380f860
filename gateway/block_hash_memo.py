"""Block hashes of prompt prefixes seen before, so a request hashes only its new tail.

A chat prompt is mostly segments the gateway has seen before (a system prompt, tool definitions,
earlier turns) followed by something new, and hashing all of its blocks again each time is most
of what hashing costs. The tokenizer names each prefix made of known segments by a key that
only those tokens have (normalize/segment_tokenizer.py); the memo keeps the hashes of the full
blocks inside such a prefix under that key, the hash root (model, cache salt, adapter) and the
block size. A request resumes hashing after the longest prefix it finds, through
``radix.hashing.extend_block_hashes``: the one hashing implementation, so the result is the
list that hashing the whole prompt gives (tests/gateway/test_block_hash_memo.py proves it).
"""

from normalize.byte_lru import ByteLRU
from normalize.segment_tokenizer import EncodedPrompt
from radix.hashing import BlockHash, block_hashes, extend_block_hashes, root_hash

BYTES_PER_HASH = 52
"""A 128-bit int (44 B) and its slot in a tuple (8 B)."""

_Entry = tuple[tuple[BlockHash, ...], int]
"""Hashes shared by the entries one request stored, and how many of them this prefix covers."""


def _entry_bytes(entry: _Entry) -> int:
    return 120 + BYTES_PER_HASH * entry[1]


class BlockHashMemo:
    """Not thread-safe: the event loop calls it."""

    def __init__(self, capacity_bytes: int = 32 << 20) -> None:
        self._cache: ByteLRU[tuple[int, BlockHash, int], _Entry] = ByteLRU(capacity_bytes, _entry_bytes)
        self.reused_blocks = 0
        """Blocks whose hashes came from the memo."""
        self.hashed_blocks = 0
        """Blocks hashed."""

    def block_hashes(
        self,
        prompt: EncodedPrompt,
        block_size: int,
        model: str,
        cache_salt: str | None = None,
        adapter: str | None = None,
    ) -> list[BlockHash]:
        """``radix.hashing.block_hashes(prompt.ids, ...)``, reusing the hashes of its longest
        known prefix seen before and remembering those of its known prefixes not seen yet."""
        known = prompt.known_prefixes
        if not known:
            hashes = block_hashes(prompt.ids, block_size, model, cache_salt, adapter)
            self.hashed_blocks += len(hashes)
            return hashes
        root = root_hash(model, cache_salt, adapter)
        hashes = []
        new = known
        for position in range(len(known) - 1, -1, -1):
            entry = self._cache.get((known[position][1], root, block_size))
            if entry is not None:
                shared, count = entry
                hashes = list(shared[:count])
                new = known[position + 1 :]
                break
        reused = len(hashes)
        extend_block_hashes(hashes, prompt.ids, block_size, model, cache_salt, adapter)
        self.reused_blocks += reused
        self.hashed_blocks += len(hashes) - reused
        if new:
            shared = tuple(hashes[: new[-1][0] // block_size])
            for tokens, key in new:
                self._cache.put((key, root, block_size), (shared, tokens // block_size))
        return hashes
