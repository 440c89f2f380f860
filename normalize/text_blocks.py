"""APPROXIMATE pseudo-tokens for backends whose tokenizer the gateway does not have.

The normalized text is cut into fixed chunks of ``CHUNK_CHARS`` characters and each chunk maps
to a 32-bit id, so ``radix.hashing.block_hashes`` still names shared prefixes. These ids are
not the backend's tokens: block boundaries do not match the engine's KV blocks, so prefix
matches are estimates of its cache, never a count of its cached tokens.
"""

from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

CHUNK_CHARS = 4

_MULTIPLIERS = np.array([0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F], dtype=np.uint64)


def approximate_token_ids(text: str) -> list[int]:
    """One pseudo-token id per ``CHUNK_CHARS`` characters (the last chunk may be shorter)."""
    code_points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.uint64)
    padded = np.zeros(-(-len(code_points) // CHUNK_CHARS) * CHUNK_CHARS, dtype=np.uint64)
    padded[: len(code_points)] = code_points + 1
    mixed = (padded.reshape(-1, CHUNK_CHARS) * _MULTIPLIERS).sum(axis=1, dtype=np.uint64)
    mixed ^= mixed >> np.uint64(29)
    mixed *= np.uint64(0xBF58476D1CE4E5B9)
    mixed ^= mixed >> np.uint64(32)
    return (mixed & np.uint64(0xFFFFFFFF)).astype(np.uint32).tolist()


def approximate_chat_text(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None) -> str:
    """A template-free rendering of a (normalized) chat request: tools, then role and content of
    each message, so requests that share leading messages share a text prefix."""
    parts = [orjson.dumps(list(tools)).decode() + "\n"] if tools else []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str):
            content = orjson.dumps(content).decode()
        parts.append(f"<{message.get('role')}>\n{content}\n")
    return "".join(parts)
