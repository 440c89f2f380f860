"""NFC in linear time gives exactly ``unicodedata``'s NFC (issue 28.1)."""

import timeit
import unicodedata
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from normalize import nfc
from normalize.nfc import LONG_RUN, PIECE_CHARS, to_nfc

MARKS = "\u0300\u0301\u0315\u0316\u031b\u0323\u0334\u0345\u05b0\u0f71\u0f72\u0f73\u0344\U0001d165\U0001d167"
STARTERS = "aeoAΩαй\u1100\u1161\u11a8가\u0bbe\u0bc6\u0f40 \n東😀é"
texts = st.lists(
    st.one_of(
        st.text(st.sampled_from(MARKS + STARTERS), max_size=40),
        st.builds(
            lambda base, marks, count: base + marks * count,
            st.sampled_from(STARTERS),
            st.text(st.sampled_from(MARKS), min_size=1, max_size=4),
            st.integers(LONG_RUN // 3, 200),
        ),
    ),
    max_size=8,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(text=texts)
def test_same_as_unicodedata(text: str) -> None:
    assert to_nfc(text) == unicodedata.normalize("NFC", text)


@settings(max_examples=30, deadline=None)
@given(text=texts, filler=st.sampled_from(["x", "é ", "東", "\u0bbe\u0301", "😀"]))
def test_same_as_unicodedata_when_cut_into_pieces(text: str, filler: str) -> None:
    long = filler * (PIECE_CHARS // len(filler) + 7) + text + filler * 50 + text
    assert to_nfc(long) == unicodedata.normalize("NFC", long)


def test_cut_characters_never_join_what_precedes_them() -> None:
    """Every character the pieces may start with is a starter, decomposes to a starter and is no
    composition's second character, checked against the whole Unicode database."""
    seconds = nfc._composition_seconds()
    for code in range(0x110000):
        char = chr(code)
        if nfc._CUT.fullmatch(char):
            first = unicodedata.normalize("NFD", char)[0]
            assert unicodedata.combining(char) == 0 and unicodedata.combining(first) == 0, hex(code)
            assert ord(first) not in seconds and code not in seconds, hex(code)
        if unicodedata.combining(unicodedata.normalize("NFD", char)[0]):
            assert nfc._LONG_RUN.fullmatch(char * LONG_RUN), hex(code)


def test_long_runs_of_marks_take_linear_time() -> None:
    """The issue's input (and other marks, out of canonical order): four times the marks take about
    four times as long (quadratic reordering would take sixteen; it took seconds at the longer
    size). A ratio of two sizes, each the least of five interleaved runs, holds on a loaded machine,
    where a bound against plain text's time failed when only the long run was slowed."""
    for marks in ("\u0315\u0316\u0334", "\u0301\u0323\u031b", "\U0001d167\u0345\u0300"):
        short, long = "a" + marks * 10_000, "a" + marks * 40_000
        times: dict[str, list[float]] = {"short": [], "long": []}
        for _ in range(5):
            times["short"].append(_time(lambda text=short: to_nfc(text)))
            times["long"].append(_time(lambda text=long: to_nfc(text)))
        growth = min(times["long"]) / min(times["short"])
        assert growth < 10, f"{marks!a}: 4x the marks took {growth:.1f}x as long"
        assert unicodedata.is_normalized("NFC", to_nfc(long))


def _time(run: Callable[[], object]) -> float:
    return timeit.timeit(run, number=1)
