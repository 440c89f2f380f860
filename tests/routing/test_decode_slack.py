"""A decode's slack against a mean-ITL target, and the decodes a stall pushes past it
(gateway/routing/decode_slack.py)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.routing.decode_slack import decodes_pushed_past, slack_s
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
