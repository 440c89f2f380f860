"""NFC in time linear in the text, and in pieces short enough that none holds the GIL for long.

CPython's ``unicodedata.normalize`` puts each run of combining marks into canonical order by
insertion sort: quadratic in the run's length. ``"a" + "\\u0315\\u0316\\u0334" * 20000`` takes
seconds, and does so holding the GIL. Here every run of at least ``LONG_RUN`` characters whose
decomposition starts with a combining mark is decomposed and stably sorted by combining class
in Python (n log n) first; ``unicodedata`` then finds it already in canonical order and passes
over it in one step. Since a character outside such a run decomposes to a starter first, no run
of marks reaches across the run's ends, and the result is exactly ``unicodedata``'s.

A long text is then normalized piece by piece, cut before characters that normalization never
joins to what precedes them (``_CUT``: a starter that decomposes to a starter and is no
composition's second character); tests/normalize/test_nfc.py checks that property over the
whole Unicode database.
"""

import re
import unicodedata
from functools import partial
from itertools import groupby

from normalize.text_pieces import cut_before

LONG_RUN = 32
"""Shorter runs of marks are left to ``unicodedata``: insertion sort on them costs about what
sorting them here would."""
PIECE_CHARS = 16_384
"""Normalized per ``unicodedata`` call (well under a millisecond each)."""


def _ranges(code_points: list[int]) -> str:
    """A regex character-class body for sorted code points, consecutive ones as ranges."""
    parts: list[str] = []
    start = previous = code_points[0]
    for code in [*code_points[1:], -1]:
        if code != previous + 1:
            parts.append(re.escape(chr(start)) + ("" if start == previous else "-" + re.escape(chr(previous))))
            start = code
        previous = code
    return "".join(parts)


def _composition_seconds() -> set[int]:
    """Characters that compose with the starter before them: second halves of primary composites,
    and the Hangul vowel and trailing jamo."""
    seconds = {*range(0x1161, 0x1176), *range(0x11A8, 0x11C3)}
    for code in range(_PLANES_WITH_MARKS):
        pair = unicodedata.decomposition(chr(code)).split()
        if len(pair) == 2 and not pair[0].startswith("<"):
            first, second = chr(int(pair[0], 16)), chr(int(pair[1], 16))
            if unicodedata.normalize("NFC", first + second) == chr(code):
                seconds.add(ord(second))
    return seconds


def _classes() -> tuple[list[int], list[int]]:
    """Characters whose decomposition starts with a mark; characters not safe to cut before (those,
    and those whose decomposition starts with a composition's second character)."""
    seconds = _composition_seconds()
    mark_first: list[int] = []
    no_cut: list[int] = []
    for code in range(_PLANES_WITH_MARKS):
        first = unicodedata.normalize("NFD", chr(code))[0]
        if unicodedata.combining(first):
            mark_first.append(code)
            no_cut.append(code)
        elif ord(first) in seconds:
            no_cut.append(code)
    return mark_first, no_cut


_PLANES_WITH_MARKS = 0x20000
"""Every mark, composition and composition exclusion lies in planes 0 and 1."""
_MARK_FIRST, _NO_CUT = _classes()
_ASTRAL = "\U00010000-\U0010ffff"
"""Outside the BMP a class is a list of ranges that ``re`` tries one by one, so these classes take
all astral characters (runs: a superset is still exact; cuts: a subset is too)."""
_LONG_RUN = re.compile(f"[{_ranges([code for code in _MARK_FIRST if code <= 0xFFFF])}{_ASTRAL}]{{{LONG_RUN},}}")
_CUT = re.compile(f"[^{_ranges([code for code in _NO_CUT if code <= 0xFFFF])}{_ASTRAL}]")
"""A starter that decomposes to a starter and composes with nothing before it: safe to cut before."""
_decompose = partial(unicodedata.normalize, "NFD")


def to_nfc(text: str) -> str:
    """``unicodedata.normalize("NFC", text)``, the same string, in linear time."""
    if unicodedata.is_normalized("NFC", text):
        return text
    if len(text) <= PIECE_CHARS and _LONG_RUN.search(text) is None:
        return unicodedata.normalize("NFC", text)
    return "".join(
        unicodedata.normalize("NFC", piece) for piece in cut_before(_long_runs_ordered(text), _CUT, PIECE_CHARS)
    )


def _long_runs_ordered(text: str) -> str:
    """``text`` with each long run of marks, and the character before it, decomposed and in
    canonical order (what NFD makes of them)."""
    out: list[str] = []
    done = 0
    for run in _LONG_RUN.finditer(text):
        start = max(run.start() - 1, done)
        out.append(text[done:start])
        out.append(_canonical_order(_decomposed(text[start : run.end()])))
        done = run.end()
    out.append(text[done:])
    return "".join(out)


def _decomposed(text: str) -> str:
    """Each character's own NFD (no reordering across characters), a slice at a time."""
    return "".join(["".join(map(_decompose, text[start : start + PIECE_CHARS])) for start in _slices(text)])


def _canonical_order(decomposed: str) -> str:
    """Each run of marks stably sorted by combining class (Unicode's canonical ordering), a slice
    at a time: a run's marks wait in one bucket per class until a starter ends the run."""
    out: list[str] = []
    buckets: dict[int, list[str]] = {}
    for start in _slices(decomposed):
        for is_mark, chars in groupby(decomposed[start : start + PIECE_CHARS], key=_is_mark):
            if is_mark:
                for mark_class, same in groupby(sorted(chars, key=unicodedata.combining), key=unicodedata.combining):
                    buckets.setdefault(mark_class, []).extend(same)
                continue
            for mark_class in sorted(buckets):
                out.extend(buckets[mark_class])
            buckets.clear()
            out.extend(chars)
    for mark_class in sorted(buckets):
        out.extend(buckets[mark_class])
    return "".join(out)


def _is_mark(char: str) -> bool:
    return unicodedata.combining(char) != 0


def _slices(text: str) -> range:
    """Starts of ``PIECE_CHARS``-long slices: a loop over them lets other threads take the GIL."""
    return range(0, len(text), PIECE_CHARS)
