"""Inferred retention keys: the bundled engine keeps active conversations' latest turns without a
client session key.

A follow-up turn routed to the owner of its private prefix is evidence of a conversation that
comes back; most one-shot prompts never do. The engine keeps a session's latest turn past one-shot
blocks (engine/session_retention.py), keyed by the session, each turn replacing the one before.
Without a client key the gateway names the conversation by its first private block: the first
block past both what every candidate replica holds and the deepest branch point of its match, a
block where more than one recent request's cached match ended (a shared system prompt's end, where
conversations part; each turn of one conversation ends one match, on the turn before). That block
is the same for every later turn of the conversation, so each turn supersedes its predecessor
instead of pinning it too.
"""

from collections.abc import Callable

from gateway.routing.types import RouteDecision, RouteRequest
from radix.hashing import BlockHash

KEY_PREFIX = "prefix:"
"""Marks an inferred key in ``kvgate_session``; client keys are sent as they came."""


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


def retention_hint(request: RouteRequest, decision: RouteDecision) -> str | None:
    """The session key a bundled engine retains the request's turn under: the client's, else the
    one the router inferred (it infers none when the client sent one)."""
    return request.session_key or decision.retention_key
