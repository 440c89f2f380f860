import re

import pytest

from normalize.volatile_spans import PRESETS, VolatileSpans, volatile_note

ALL_PRESETS = VolatileSpans(PRESETS)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("Current time: 2026-11-29T10:00:00Z.", "2026-11-29T10:00:00Z"),
        ("Now: 2026-11-29 10:00:00.123+01:00 ok", "2026-11-29 10:00:00.123+01:00"),
        ("Today is 2026-11-29.", "2026-11-29"),
        ("Today is 11/29/2026.", "11/29/2026"),
        ("Meeting at 9:30 pm.", "9:30 pm"),
        ("Session 123e4567-e89b-12d3-a456-426614174000 open", "123e4567-e89b-12d3-a456-426614174000"),
        ("Trace req_8f2a9c1dE7 here", "req_8f2a9c1dE7"),
    ],
)
def test_presets_match(text: str, value: str) -> None:
    stable, values = ALL_PRESETS.extract(text)
    assert values == [value]
    assert value not in stable and "[volatile #1]" in stable


@pytest.mark.parametrize(
    "text", ["Version 2.10.3, port 8080, 3.14159", "requests per second", "call 555-1234", "id deadbeef"]
)
def test_presets_leave_alone(text: str) -> None:
    assert ALL_PRESETS.extract(text) == (text, [])


def test_numbering_continues_and_note_lists_values() -> None:
    spans = VolatileSpans({"date": PRESETS["date"], "own": r"ticket-\d+"})
    stable, values = spans.extract("on 2026-01-02 for ticket-77", first_number=3)
    assert stable == "on [volatile #3] for [volatile #4]"
    assert values == ["2026-01-02", "ticket-77"]
    assert volatile_note(["a", "b"]) == "\n\n[volatile #1: a]\n[volatile #2: b]"


@pytest.mark.parametrize(
    "text",
    [
        "At 2026-11-29T10:00:00Z and 9:30 pm, req_8f2a9c1dE7 on 11/29/2026; 12:30:45 AM. v1.2:3 1:1:1:1:",
        "1:1:1:1:" * 500 + " 2026-01-02 10:00+01:00 " + "req-" * 50 + "123e4567-e89b-12d3-a456-426614174000",
    ],
)
def test_the_regex_package_matches_as_re_does(text: str) -> None:
    """The patterns run on `regex` (it releases the GIL while scanning); their matches are `re`'s."""
    compiled = re.compile("|".join(f"(?:{pattern})" for pattern in PRESETS.values()))
    assert ALL_PRESETS.extract(text)[1] == [match.group() for match in compiled.finditer(text)]
