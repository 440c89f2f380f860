"""A decode's slack against a mean-ITL target, and the decodes a stall pushes past it
(gateway/routing/decode_slack.py)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.routing.decode_slack import decodes_pushed_past, slack_s
from gateway.routing.output_lengths import OutputLengths
from protocol.replica_stats import DecodeProgress

TARGET_S = 0.05


def test_a_decode_keeps_its_pace_for_as_many_tokens_again_as_it_has_made() -> None:
    """11 tokens in 0.2 s: 20 ms a token, 22 tokens expected in all; 30 ms under the target over 21 intervals."""
    assert slack_s(DecodeProgress(11, 0.2, 500), TARGET_S) == pytest.approx(0.03 * 21)


def test_max_tokens_bounds_the_tokens_to_come() -> None:
    assert slack_s(DecodeProgress(11, 0.2, 1), TARGET_S) == pytest.approx(0.03 * 11)


def test_a_decode_with_only_its_first_token_has_one_target_of_slack() -> None:
    assert slack_s(DecodeProgress(1, 0.0, 300), TARGET_S) == pytest.approx(TARGET_S)


def test_a_request_before_its_first_token_is_guessed_to_run_to_its_bound() -> None:
    """Queued or prefilling: no pace yet; the target times the intervals ``max_tokens`` allows."""
    assert slack_s(DecodeProgress(0, 0.0, 3), TARGET_S) == pytest.approx(2 * TARGET_S)
    assert slack_s(DecodeProgress(0, 0.0, 256), TARGET_S) == pytest.approx(255 * TARGET_S)


def test_a_stall_counts_the_decodes_it_pushes_past_not_those_already_past_or_with_room() -> None:
    roomy = DecodeProgress(101, 1.0, 500)  # 10 ms a token: 8 s of slack
    tight = DecodeProgress(11, 0.45, 500)  # 45 ms a token: 0.105 s
    fresh = DecodeProgress(1, 0.0, 500)  # 0.05 s
    lost = DecodeProgress(11, 0.6, 500)  # 60 ms a token: past the target already
    short_queued = DecodeProgress(0, 0.0, 4)  # capped at 4 tokens: 0.15 s
    long_queued = DecodeProgress(0, 0.0, 500)  # 24.95 s
    decodes = [roomy, tight, fresh, lost, short_queued, long_queued]
    assert decodes_pushed_past(decodes, 0.01, TARGET_S) == 0
    assert decodes_pushed_past(decodes, 0.08, TARGET_S) == 1
    assert decodes_pushed_past(decodes, 0.5, TARGET_S) == 3
    assert decodes_pushed_past(decodes, 10.0, TARGET_S) == 4
    assert decodes_pushed_past(decodes, 30.0, TARGET_S) == 5


@given(
    st.lists(
        st.builds(
            DecodeProgress,
            st.integers(0, 4000),
            st.floats(0, 100, allow_nan=False),
            st.integers(1, 4000),
        ),
        max_size=30,
    ),
    st.floats(0, 30, allow_nan=False),
    st.floats(0, 30, allow_nan=False),
)
def test_a_longer_stall_never_pushes_fewer_past(decodes: list[DecodeProgress], stall: float, more: float) -> None:
    assert decodes_pushed_past(decodes, stall, TARGET_S) <= decodes_pushed_past(decodes, stall + more, TARGET_S)


def test_with_the_gateways_answers_a_queued_request_counts_as_the_share_that_would_stop_soon() -> None:
    """Clients send 4,096 and answers stop at 1..100 tokens: a queued request's bound says nothing,
    the answers say a stall of 1 s (21 tokens at 50 ms) breaks the ones that stop before 21 tokens."""
    lengths = OutputLengths()
    for n in range(1, 101):
        lengths.record(n, 4096)
    queued = DecodeProgress(0, 0.0, 4096)
    assert decodes_pushed_past([queued], 1.0, TARGET_S) == 0, "without them: seconds of slack, never counted"
    assert decodes_pushed_past([queued], 1.0, TARGET_S, lengths) == pytest.approx(19 / 99)


def test_with_answers_that_run_to_their_bound_a_queued_requests_bound_is_its_length() -> None:
    """Clients cap tightly: a queued request capped at 10 tokens is broken by a stall over 0.45 s."""
    lengths = OutputLengths()
    for n in range(50, 150):
        lengths.record(n, n)
    queued = DecodeProgress(0, 0.0, 10)
    assert decodes_pushed_past([queued], 0.4, TARGET_S, lengths) == 0
    assert decodes_pushed_past([queued], 0.5, TARGET_S, lengths) == 1


def test_a_decode_that_has_begun_keeps_its_guess_and_a_queued_one_its_bound_until_answers_are_known() -> None:
    """Started: 20 ms a token, guessed 100 in all (2.97 s of slack), whatever the answers say.
    Queued: before 32 answers, guessed to run to its 4,096 (205 s of slack)."""
    started, queued = DecodeProgress(50, 1.0, 4046), DecodeProgress(0, 0.0, 4096)
    few = OutputLengths()
    for _ in range(31):
        few.record(10, 4096)
    assert decodes_pushed_past([started, queued], 3.0, TARGET_S, few) == 1
    many = OutputLengths()
    for _ in range(40):
        many.record(10, 4096)
    assert decodes_pushed_past([started, queued], 3.0, TARGET_S, many) == 2
    assert decodes_pushed_past([started], 2.9, TARGET_S, many) == 0


@given(
    st.lists(st.builds(DecodeProgress, st.integers(0, 400), st.floats(0, 20, allow_nan=False), st.integers(1, 400))),
    st.lists(st.tuples(st.integers(1, 400), st.integers(1, 4096)), min_size=32, max_size=64),
    st.floats(0, 30, allow_nan=False),
    st.floats(0, 30, allow_nan=False),
)
def test_with_answers_a_longer_stall_never_pushes_fewer_past(
    decodes: list[DecodeProgress], answers: list[tuple[int, int]], stall: float, more: float
) -> None:
    lengths = OutputLengths()
    for output, bound in answers:
        lengths.record(output, bound)
    fewer = decodes_pushed_past(decodes, stall, TARGET_S, lengths)
    assert 0 <= fewer <= decodes_pushed_past(decodes, stall + more, TARGET_S, lengths) + 1e-9 <= len(decodes) + 1e-9
