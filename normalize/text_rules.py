"""Text rules: each maps a text to its canonical form and returns the input object when it has
nothing to change (so a cheap identity check tells whether a rule fired).

Only invisible or meaningless differences are removed by the default rules; joiners that carry
meaning (U+200C/U+200D in emoji sequences and Indic or Persian script) are kept.
"""

import re
from collections.abc import Callable

from normalize.nfc import to_nfc

TextRule = Callable[[str], str]

_INVISIBLE = ("\ufeff", "\u200b", "\u2060")
_INVISIBLE_RE = re.compile("[" + "".join(_INVISIBLE) + "]")
_HORIZONTAL_SPACE = "\t\x0b\x0c \xa0\u1680" + "".join(chr(c) for c in range(0x2000, 0x200B)) + "\u202f\u205f\u3000"
_SPACE_RUN_RE = re.compile(r"[ \t]{2,}|\t")


def remove_invisible_chars(text: str) -> str:
    if any(char in text for char in _INVISIBLE):
        return _INVISIBLE_RE.sub("", text)
    return text


def unify_line_endings(text: str) -> str:
    if "\r" not in text:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")


def strip_trailing_whitespace(text: str) -> str:
    """Spaces and tabs (any Unicode horizontal space) before each LF or CRLF and at the end."""
    lines = text.split("\n")
    stripped = [_rstrip_keeping_cr(line) for line in lines]
    return text if stripped == lines else "\n".join(stripped)


def _rstrip_keeping_cr(line: str) -> str:
    if line.endswith("\r"):
        return line[:-1].rstrip(_HORIZONTAL_SPACE) + "\r"
    return line.rstrip(_HORIZONTAL_SPACE)


def collapse_spaces(text: str) -> str:
    if "\t" not in text and "  " not in text:
        return text
    return _SPACE_RUN_RE.sub(" ", text)


TEXT_RULES: dict[str, TextRule] = {
    "invisible_chars": remove_invisible_chars,
    "nfc": to_nfc,
    "line_endings": unify_line_endings,
    "trailing_whitespace": strip_trailing_whitespace,
    "collapse_spaces": collapse_spaces,
}
"""In the order they run; volatile-span extraction runs after ``line_endings``."""
