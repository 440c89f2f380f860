"""Completed answers' lengths against their bounds, and what they say of a decode still running
(gateway/routing/output_lengths.py)."""

from hypothesis import given
from hypothesis import strategies as st

from gateway.routing.output_lengths import MIN_ANSWERS, OutputLengths


def lengths_of(answers: list[tuple[int, int]], capacity: int = 2048) -> OutputLengths:
    lengths = OutputLengths(capacity)
    for output, bound in answers:
        lengths.record(output, bound)
    return lengths


def test_it_says_nothing_before_enough_answers() -> None:
    lengths = lengths_of([(100, 100)] * (MIN_ANSWERS - 1))
    assert lengths.fraction_shorter(0, 100, 50) is None
    lengths.record(100, 100)
    assert lengths.fraction_shorter(0, 100, 50) == 0.0


def test_answers_that_run_to_their_bound_make_the_bound_the_length() -> None:
    """Clients that cap tightly: every answer ends at max_tokens, so a decode with bound 40 makes 40."""
    lengths = lengths_of([(n, n) for n in range(10, 110)])
    assert lengths.fraction_shorter(5, 40, 40) == 0.0
    assert lengths.fraction_shorter(5, 40, 41) == 1.0


def test_answers_far_short_of_a_loose_bound_are_scaled_to_the_decodes_bound() -> None:
    """Clients send 4,096 and answers stop at 1..100 tokens: a decode with the same bound stops
    before 26 tokens a quarter of the time, and after 50 tokens only half the rest stop before 76."""
    lengths = lengths_of([(n, 4096) for n in range(1, 101)])
    assert lengths.fraction_shorter(1, 4096, 26) == 24 / 99
    assert lengths.fraction_shorter(50, 4096, 76) == 25 / 50


def test_a_decode_longer_than_every_answer_known_gets_no_guess() -> None:
    lengths = lengths_of([(n, 4096) for n in range(1, 101)])
    assert lengths.fraction_shorter(100, 4096, 500) is None


def test_the_oldest_answers_leave_first() -> None:
    lengths = lengths_of([(10, 100)] * 40 + [(100, 100)] * 40, capacity=40)
    assert len(lengths) == 40
    assert lengths.fraction_shorter(0, 100, 50) == 0.0


def test_answers_with_no_tokens_or_no_bound_are_not_recorded() -> None:
    lengths = lengths_of([(0, 100), (5, 0)])
    assert len(lengths) == 0


@given(
    st.lists(st.tuples(st.integers(1, 5000), st.integers(1, 5000)), min_size=MIN_ANSWERS, max_size=200),
    st.integers(0, 5000),
    st.integers(1, 5000),
    st.floats(0, 10_000, allow_nan=False),
    st.floats(0, 10_000, allow_nan=False),
)
def test_a_share_is_a_probability_that_grows_with_the_length_asked(
    answers: list[tuple[int, int]], made: int, bound: int, shorter_than: float, more: float
) -> None:
    lengths = lengths_of(answers)
    share = lengths.fraction_shorter(made, bound, shorter_than)
    larger = lengths.fraction_shorter(made, bound, shorter_than + more)
    if share is None:
        assert larger is None
        return
    assert larger is not None
    assert 0.0 <= share <= larger <= 1.0
