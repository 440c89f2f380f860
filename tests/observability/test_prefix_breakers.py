"""Prefix breakers: found where prompts that agree later first differ, and nowhere else."""

import random

import numpy as np

from gateway.observability.prefix_breakers import (
    MIN_LOST_TOKENS,
    NO_TEXT_PREVIEW,
    PrefixBreakers,
    find_breaker,
    redacted_preview,
)


def tokens(*parts: list[int]) -> list[int]:
    return [token for part in parts for token in part]


HEADER = list(range(1000, 1010))
BODY = list(range(2000, 2200))


def decode(token_ids: list[int]) -> str:
    return " ".join(str(token) for token in token_ids)


def test_a_varying_span_followed_by_the_same_text_is_a_breaker() -> None:
    first = np.array(tokens(HEADER, [1, 2, 3], BODY, [7]))
    second = np.array(tokens(HEADER, [4, 5], BODY, [8, 9]))
    breaker = find_breaker(second, [first])
    assert breaker is not None
    assert (breaker.position, breaker.span_tokens, breaker.lost_tokens) == (10, 2, len(BODY))


def test_prompts_that_simply_go_different_ways_have_no_breaker() -> None:
    rng = random.Random(0)
    first = np.array(tokens(HEADER, BODY, [rng.randrange(50_000) for _ in range(300)]))
    second = np.array(tokens(HEADER, BODY, [rng.randrange(50_000) for _ in range(300)]))
    assert find_breaker(second, [first]) is None


def test_a_short_agreement_after_the_span_is_not_enough() -> None:
    tail = BODY[: MIN_LOST_TOKENS - 1]
    first = np.array(tokens(HEADER, [1], tail, [3, 3, 3]))
    second = np.array(tokens(HEADER, [2], tail, [4, 4, 4]))
    assert find_breaker(second, [first]) is None


def test_identical_prompts_and_extensions_have_no_breaker() -> None:
    prompt = np.array(tokens(HEADER, BODY))
    assert find_breaker(prompt, [prompt.copy()]) is None
    assert find_breaker(np.array(tokens(HEADER, BODY, [5, 6])), [prompt]) is None


def test_the_partner_is_the_recent_prompt_with_the_longest_shared_prefix() -> None:
    other_group = np.array(tokens(HEADER[:4], list(range(5000, 5300))))
    same_group = np.array(tokens(HEADER, [1], BODY))
    breaker = find_breaker(np.array(tokens(HEADER, [2], BODY)), [same_group, other_group])
    assert breaker is not None and breaker.position == len(HEADER)


def test_groups_count_requests_per_position_worst_first() -> None:
    breakers = PrefixBreakers(block_size=16, preview_chars=24, samples_per_s=1e9)
    for second in range(5):
        breakers.observe("m", tokens(HEADER, [second], BODY), decode)
    for request_id in range(3):
        breakers.observe("m", tokens(HEADER, [9], BODY[:50], [request_id + 100], BODY[50:]), decode)
    rows = breakers.table()
    assert rows[0]["position"] == len(HEADER)
    assert rows[0]["block"] == 0
    assert rows[0]["requests"] == 5
    assert rows[0]["mean_lost_tokens"] >= MIN_LOST_TOKENS
    assert {row["position"] for row in rows} == {len(HEADER), len(HEADER) + 1 + 50}


def test_models_are_kept_apart() -> None:
    breakers = PrefixBreakers(block_size=16, preview_chars=24, samples_per_s=1e9)
    breakers.observe("a", tokens(HEADER, [1], BODY), decode)
    breakers.observe("b", tokens(HEADER, [2], BODY), decode)
    assert breakers.table() == []


def test_comparisons_are_sampled_at_the_configured_rate() -> None:
    breakers = PrefixBreakers(block_size=16, preview_chars=24, samples_per_s=1e-3)
    breakers.observe("m", tokens(HEADER, [1], BODY), decode)
    assert breakers.observe("m", tokens(HEADER, [2], BODY), decode) is None
    assert breakers.table() == []


def test_preview_masks_the_varying_span_and_keeps_short_context() -> None:
    preview = redacted_preview("You are helpful.\nCurrent time: ", "2026-11-29 09:53:24 Sunday", 15)
    assert preview == "↵Current time: ⟦9999-99-99 99:99:99 xxxxxx⟧"
    assert redacted_preview("secret context", "id-42", 0) == "⟦xx-99⟧"


def test_an_inserted_span_is_counted_on_the_prompt_that_holds_it() -> None:
    without = np.array(tokens(HEADER, BODY))
    with_line = np.array(tokens(HEADER, [7, 7, 7], BODY))
    assert find_breaker(without, [with_line]) is None
    breaker = find_breaker(with_line, [without])
    assert breaker is not None and (breaker.position, breaker.span_tokens) == (len(HEADER), 3)


def test_previews_without_a_tokenizer_say_so() -> None:
    breakers = PrefixBreakers(block_size=16, preview_chars=24, samples_per_s=1e9)
    breakers.observe("m", tokens(HEADER, [1], BODY), None)
    breakers.observe("m", tokens(HEADER, [2], BODY), None)
    assert breakers.table()[0]["preview"] == NO_TEXT_PREVIEW
