"""Inferred retention keys: a follow-up on a private prefix, without a client session key, carries a
key naming its conversation, the same for every later turn, so the bundled engine keeps the
conversation's latest turn past one-shot prompts."""

import pytest

from gateway.routing.retention_keys import KEY_PREFIX, conversation_key, first_private_block
from gateway.routing.router import Router
from gateway.routing.types import RouteRequest
from radix.hashing import block_hashes
from tests.routing.helpers import BLOCK, MODEL, route_and_send, router, state

HASHES = list(range(100, 110))
IDLE = [state("a"), state("b"), state("c")]
SYSTEM = list(range(64))
"""A system prompt every conversation starts with: four blocks."""


def key_of(hash_: int) -> str:
    return f"{KEY_PREFIX}{hash_:016x}"


def test_a_key_is_its_block_s_hash_marked_as_inferred() -> None:
    assert conversation_key(0x1F) == "prefix:000000000000001f" == key_of(0x1F)


def turn(conversation: int, turns: int, request_id: str, session_key: str | None = None) -> RouteRequest:
    """The prompt of a conversation's turn ``turns``: the system prompt, then 64 tokens per turn."""
    tokens = SYSTEM + [conversation * 100_000 + i for i in range(64 * turns)]
    hashes = block_hashes(tokens, BLOCK, MODEL)
    return RouteRequest(request_id, MODEL, hashes, len(tokens), 16, session_key=session_key, token_ids=tokens)


def converse(r: Router, conversation: int, turns: int) -> list[str | None]:
    """Route and dispatch ``turns`` turns of a conversation to idle replicas; each turn's key."""
    keys = []
    for number in range(1, turns + 1):
        request = turn(conversation, number, f"c{conversation}-t{number}")
        decision = route_and_send(r, request, IDLE)
        keys.append(decision.retention_key)
    return keys


def test_the_key_is_the_first_block_past_what_every_candidate_holds() -> None:
    assert first_private_block(HASHES, [6, 2, 2], lambda _: False) == 2
    assert first_private_block(HASHES, [6, 0, 2], lambda _: False) == 0


def test_the_key_starts_past_the_deepest_branch_point() -> None:
    assert first_private_block(HASHES, [6, 0, 0], lambda block: block in (101, 103)) == 4


def test_a_match_all_shared_or_held_everywhere_has_no_key() -> None:
    assert first_private_block(HASHES, [3, 3, 3], lambda _: False) is None
    assert first_private_block(HASHES, [4, 0, 0], lambda block: block == 103) is None
    assert first_private_block(HASHES, [0, 0, 0], lambda _: False) is None


def test_every_follow_up_of_a_conversation_carries_one_key_and_conversations_differ() -> None:
    r = router()
    for other in (7, 8, 9):
        converse(r, other, 1)
    first = converse(r, 1, 4)
    second = converse(r, 2, 3)
    assert first[0] is None, "a first turn matches only the system prompt, where conversations part"
    assert first[1] is not None and first[1:] == [first[1]] * 3
    assert second[1] is not None and second[1:] == [second[1]] * 2 and second[1] != first[1]


def test_conversations_are_named_past_the_system_prompt_once_two_have_parted_there() -> None:
    """The first two conversations are named by the system prompt: until the second one's first turn
    ends its match there, nothing has parted there. From the third on, each has its own name."""
    r = router()
    keys = [converse(r, conversation, 2)[1] for conversation in range(1, 11)]
    assert keys[0] == keys[1] == key_of(turn(1, 1, "x").block_hashes[0])
    assert None not in keys and len(set(keys[2:])) == 8 and keys[0] not in keys[2:]
    assert keys[-1] == key_of(turn(10, 1, "x").block_hashes[4])


def test_a_client_session_key_wins_and_the_router_infers_none() -> None:
    r = router()
    converse(r, 1, 1)
    decision = r.route(turn(1, 2, "keyed", session_key="user-7"), IDLE).decision
    assert decision.reason == "prefix-hit" and decision.retention_key is None


@pytest.mark.parametrize("setting", [{"infer_retention_keys": False}, {"policy": "least_loaded"}])
def test_off_in_config_or_for_a_policy_without_prefix_hits(setting: dict[str, object]) -> None:
    assert converse(router(**setting), 1, 3) == [None, None, None]


def test_a_load_spill_carries_no_key() -> None:
    r = router(ttft_target_s=0.1)
    converse(r, 1, 1)
    owner = r.route(turn(1, 2, "probe"), IDLE).decision.backend
    busy = [state(name, in_flight=4, prefill_tokens=20_000) if name == owner else state(name) for name in "abc"]
    decision = r.route(turn(1, 2, "spilled"), busy).decision
    assert decision.reason == "load-spill" and decision.retention_key is None


def test_a_regenerated_turn_does_not_rename_the_conversation() -> None:
    """Sending turn 2 again (a regenerated answer) ends two more matches on turn 2's last block and
    makes it a branch point; turn 3 still gets the key turn 2 got, remembered by that block."""
    r = router()
    for other in (7, 8, 9):
        converse(r, other, 1)
    key = converse(r, 1, 2)[1]
    for attempt in range(2):
        again = turn(1, 2, f"regenerated-{attempt}")
        route_and_send(r, again, IDLE)
    assert key is not None and r.route(turn(1, 3, "turn-3"), IDLE).decision.retention_key == key
