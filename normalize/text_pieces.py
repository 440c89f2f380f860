"""Long text in pieces cut where a pattern matches, for work done a piece at a time: NFC between
starters (normalize/nfc.py), tokenization between words (normalize/text_chunks.py)."""

import re


def cut_before(text: str, boundary: re.Pattern[str], size: int) -> list[str]:
    """``text`` in pieces of at least ``size`` characters (the last may be shorter), each cut
    before the first ``boundary`` match past ``size``; past the last match the text stays whole."""
    pieces: list[str] = []
    start = 0
    while len(text) - start > size:
        match = boundary.search(text, start + size)
        if match is None:
            break
        pieces.append(text[start : match.start()])
        start = match.start()
    pieces.append(text[start:])
    return pieces
