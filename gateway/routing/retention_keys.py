"""Inferred retention keys: the bundled engine keeps active conversations' latest turns without a
client session key.

A follow-up turn routed to the owner of its private prefix is evidence of a conversation that
comes back; most one-shot prompts never do. The engine keeps a session's latest turn past one-shot
blocks (engine/core/session_retention.py), keyed by the session, each turn replacing the one before.
Without a client key the gateway names the conversation by its first private block: the first
block past both what every candidate replica holds and the deepest branch point of its match, a
block where more than one recent request's cached match ended (a shared system prompt's end, where
conversations part; each turn of one conversation ends one match, on the turn before). That block
is the same for every later turn of the conversation, so each turn supersedes its predecessor
instead of pinning it too.

Every key that reaches an engine is scoped (``scoped_key``): a digest of the tenant, the cache salt,
the key's kind and the key, structured (msgpack) so no client string can pass for another field,
behind the tenant's namespace. Two tenants that send the same ``x-session-id`` get two sessions,
and the engine shares its retention out fairly between namespaces (engine/core/session_retention.py).
"""

import hashlib
from collections.abc import Callable

import msgspec

from gateway.routing.types import RouteDecision, RouteRequest
from radix.hashing import BlockHash

KEY_PREFIX = "prefix:"
"""Marks an inferred key (before it is scoped), so it never equals a client's."""
NAMESPACE_SEPARATOR = ":"
"""Ends the namespace in a ``kvgate_session``; the engine reads the same (engine/core/session_retention.py)."""
CLIENT, INFERRED = "client", "inferred"
"""The kinds of key: one the client named, one the router inferred."""


def first_private_block(
    hashes: list[BlockHash],
    matched_blocks: list[int],
    is_branch_point: Callable[[BlockHash], bool],
) -> int | None:
    """The index of the block that names the conversation a prompt continues, or None when its
    match is all shared.

    ``matched_blocks``: the leading blocks of ``hashes`` each candidate replica holds.
    ``is_branch_point``: whether more than one recent request's match ended on a block."""
    owned = max(matched_blocks, default=0)
    first_private = min(matched_blocks, default=0)
    for index in range(owned - 1, first_private - 1, -1):
        if is_branch_point(hashes[index]):
            first_private = index + 1
            break
    return first_private if first_private < owned else None


def conversation_key(block_hash: BlockHash) -> str:
    """The retention key of the conversation named by ``block_hash``."""
    return f"{KEY_PREFIX}{block_hash:016x}"


def tenant_namespace(tenant: str | None) -> str:
    """The retention namespace of ``tenant``'s sessions at the engines (hex, no separator)."""
    return hashlib.blake2b(msgspec.msgpack.encode(["tenant", tenant]), digest_size=8).hexdigest()


def scoped_key(tenant: str | None, cache_salt: str | None, kind: str, key: str) -> str:
    """``key`` as only ``tenant`` with ``cache_salt`` can name it: ``<namespace>:<digest>``.

    BLAKE2b rather than xxh3: the input is the client's, and a collision would be one tenant's
    turn superseding another's, so it must not be craftable."""
    digest = hashlib.blake2b(msgspec.msgpack.encode([tenant, cache_salt, kind, key]), digest_size=16).hexdigest()
    return f"{tenant_namespace(tenant)}{NAMESPACE_SEPARATOR}{digest}"


def client_session_key(tenant: str, cache_salt: str | None, named: object) -> str | None:
    """The session the client named (``x-session-id``, ``user`` or ``kvgate_session``), scoped to its
    tenant and cache salt; None when it named none."""
    return scoped_key(tenant, cache_salt, CLIENT, named) if isinstance(named, str) and named else None


def retention_hint(request: RouteRequest, decision: RouteDecision) -> str | None:
    """The session key a bundled engine retains the request's turn under: the client's (scoped when
    the request was parsed), else the one the router inferred, scoped here (it infers none when the
    client sent one)."""
    if request.session_key is not None:
        return request.session_key
    if decision.retention_key is None:
        return None
    return scoped_key(request.tenant, request.cache_salt, INFERRED, decision.retention_key)
