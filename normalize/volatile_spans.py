"""Volatile spans: values (dates, times, ids) that change per request inside a stable system prompt.

Each match is replaced by a numbered marker and the values are listed in a note appended
after the stable text, so everything before the note is byte-identical across requests that
differ only in those values::

    "Now: 2026-11-29 10:00. Be brief."
    -> "Now: [volatile #1]. Be brief.\\n\\n[volatile #1: 2026-11-29 10:00]"

The patterns run on the ``regex`` package (``re``'s syntax and matching, in its default version)
because it can let go of the GIL while it scans: a scan of a megabyte holds ``re`` for 0.1-0.2 s,
and on a worker thread (``Normalizer.apply_async``) that is the event loop's time too.
"""

from collections.abc import Mapping

import regex

PRESETS: dict[str, str] = {
    "iso_datetime": r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?(?!\d)",
    "date": r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{4}\b",
    "time": r"\b\d{1,2}:\d{2}(?::\d{2})?(?:\s?[AaPp][Mm])?\b",
    "uuid": r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",
    "request_id": r"\breq(?:uest)?[-_][A-Za-z0-9]{6,}\b",
}
"""Built-in patterns by name. At one position, a pattern listed earlier in the config wins."""


class VolatileSpans:
    """Replaces volatile values by markers and writes the note that carries them."""

    def __init__(self, patterns: Mapping[str, str]) -> None:
        self._regex = regex.compile("|".join(f"(?:{pattern})" for pattern in patterns.values()))

    def extract(self, text: str, first_number: int = 1) -> tuple[str, list[str]]:
        """``text`` with each match replaced by ``[volatile #n]``, and the matched values in order."""
        values: list[str] = []

        def marker(match: regex.Match[str]) -> str:
            values.append(match.group())
            return f"[volatile #{first_number + len(values) - 1}]"

        return self._regex.sub(marker, text, concurrent=True), values


def volatile_note(values: list[str]) -> str:
    """The note appended after the stable text, one line per value."""
    return "\n\n" + "\n".join(f"[volatile #{number}: {value}]" for number, value in enumerate(values, 1))
