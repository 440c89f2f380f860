"""Each text rule: inputs it must change, and inputs it must leave alone (returned as is)."""

import pytest

from normalize.text_rules import (
    collapse_spaces,
    remove_invisible_chars,
    strip_trailing_whitespace,
    to_nfc,
    unify_line_endings,
)

CHANGES = [
    (remove_invisible_chars, "\ufeffYou are helpful.", "You are helpful."),
    (remove_invisible_chars, "zero\u200bwidth and word\u2060joiner", "zerowidth and wordjoiner"),
    (to_nfc, "Cafe\u0301 nai\u0308ve", "Café naïve"),
    (to_nfc, "\u1100\u1161", "\uac00"),
    (unify_line_endings, "a\r\nb\r\n", "a\nb\n"),
    (unify_line_endings, "a\rb\r\r\nc", "a\nb\n\nc"),
    (strip_trailing_whitespace, "a  \nb\t\nc ", "a\nb\nc"),
    (strip_trailing_whitespace, "ideographic\u3000\nnbsp\xa0\n", "ideographic\nnbsp\n"),
    (strip_trailing_whitespace, "crlf kept \r\nnext", "crlf kept\r\nnext"),
    (collapse_spaces, "a   b\t\tc\td", "a b c d"),
    (collapse_spaces, "    indented", " indented"),
]

UNCHANGED = [
    (remove_invisible_chars, "family 👨\u200d👩\u200d👧 and Persian \u200c joiner"),
    (remove_invisible_chars, "plain text"),
    (to_nfc, "Café naïve 東京 😀"),
    (to_nfc, "ﬁ ligature and Ⅻ numeral"),
    (unify_line_endings, "a\nb\n\n"),
    (strip_trailing_whitespace, "  leading kept\n\tindent kept\nend"),
    (strip_trailing_whitespace, "a\n\n\nb"),
    (collapse_spaces, "a b c\nd e"),
]


@pytest.mark.parametrize(("rule", "text", "expected"), CHANGES)
def test_rule_changes(rule, text: str, expected: str) -> None:
    assert rule(text) == expected


@pytest.mark.parametrize(("rule", "text"), UNCHANGED)
def test_rule_leaves_alone(rule, text: str) -> None:
    assert rule(text) is text


def test_rules_are_idempotent() -> None:
    for rule, text, _ in CHANGES:
        once = rule(text)
        assert rule(once) == once
