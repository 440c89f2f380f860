"""The one block-hashing implementation, shared by the gateway and the engine.

A prompt is cut into blocks of ``block_size`` tokens; only full blocks are hashed. Each block's
hash is a 128-bit xxh3 over its parent's hash and its token ids, so a hash names the whole
prefix up to and including that block. The root (a 128-bit BLAKE2b of the structured fields) is
seeded by the model name and the cache salt, so two tenants with isolated caches (different
salts) never share a hash. A LoRA adapter name
seeds the root too, so an adapter's blocks never match the base model's or another adapter's
(vLLM mixes the adapter into its block hashes the same way).
"""

import hashlib
from array import array
from collections.abc import Sequence

import msgspec
import xxhash

BlockHash = int
"""An unsigned 128-bit integer."""

_HASH_BYTES = 16

TOKEN_ID_LIMIT = 1 << 32
"""Token ids are hashed as unsigned 32-bit integers, so every id must lie in ``[0, TOKEN_ID_LIMIT)``;
the hashing functions raise ``OverflowError`` on any other. Client-supplied ids are checked
against this bound when a request is parsed."""


_ROOT_VERSION = b"kvgate-root-v2"


def _field(text: str | None) -> bytes | None:
    """One root field as bytes; an absent or empty field is None. ``surrogatepass`` keeps every
    ``str`` encodable, and distinct strings stay distinct bytes."""
    return text.encode("utf-8", "surrogatepass") if text else None


def root_hash(model: str, cache_salt: str | None = None, adapter: str | None = None) -> BlockHash:
    """The parent hash of a prompt's first block.

    The fields are a msgpack array of length-prefixed byte strings (nil when absent), never joined
    with a separator: a client's ``cache_salt`` may hold any character, so a separator it can send
    would let one (model, salt, adapter) tuple hash like another (issue 28, finding 3). BLAKE2b
    rather than xxh3 (once per prompt, about a microsecond): the salt is the client's, and two
    roots that collide would share KV across tenants or adapters, so a collision must not be
    craftable."""
    seed = msgspec.msgpack.encode([_ROOT_VERSION, _field(model), _field(cache_salt), _field(adapter)])
    return int.from_bytes(hashlib.blake2b(seed, digest_size=_HASH_BYTES).digest(), "little")


def hash_block(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """Hash of one full block given its parent's hash."""
    data = parent.to_bytes(_HASH_BYTES, "little") + array("I", token_ids).tobytes()
    return xxhash.xxh3_128_intdigest(data)


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    model: str,
    cache_salt: str | None = None,
    adapter: str | None = None,
) -> list[BlockHash]:
    """Chained hashes of every full block of ``token_ids``, first block first."""
    return extend_block_hashes([], token_ids, block_size, model, cache_salt, adapter)


def extend_block_hashes(
    hashes: list[BlockHash],
    token_ids: Sequence[int],
    block_size: int,
    model: str,
    cache_salt: str | None = None,
    adapter: str | None = None,
) -> list[BlockHash]:
    """Append hashes for blocks of ``token_ids`` not yet covered by ``hashes`` (decode growth)."""
    parent = hashes[-1] if hashes else root_hash(model, cache_salt, adapter)
    first = len(hashes) * block_size
    full_end = first + (len(token_ids) - first) // block_size * block_size
    if full_end <= first:
        return hashes
    data = array("I", token_ids[first:full_end]).tobytes()
    step = block_size * 4
    digest = xxhash.xxh3_128_intdigest
    for offset in range(0, len(data), step):
        parent = digest(parent.to_bytes(_HASH_BYTES, "little") + data[offset : offset + step])
        hashes.append(parent)
    return hashes


def hash_to_bytes(block_hash: BlockHash) -> bytes:
    """A hash as 16 big-endian bytes (the block manager's events; on the ZMQ wire the engine sends
    vLLM's 64-bit cut of it, ``radix.kv_event_format.wire_block_hash``)."""
    return block_hash.to_bytes(_HASH_BYTES, "big")
