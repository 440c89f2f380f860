"""Long text cut where the tokenizer always starts a new word, so its pieces can be tokenized at
once on every core (``encode_batch`` spreads a batch over its thread pool; one text stays on one
core) and their ids spliced.

A cut goes before a space between two ASCII letters (``...ab| cd...``). The regex pre-tokenizers
of byte-level BPE tokenizers (GPT-2's, Llama 3's, Qwen's) end a word at its last letter and start
the next one at the space, and BPE never merges across words, so the pieces' ids are the whole
text's. Tokenizers where that fails (a normalizer that strips, a pre-tokenizer that marks only
the input's start, an added token with such a space inside) are caught by a self-test at load
time and tokenize each text whole.
"""

import re
from collections.abc import Callable

from tokenizers import Tokenizer

from normalize.text_pieces import cut_before

CHUNK_CHARS = 8192
"""Characters per piece, about 2k tokens of prose: small enough to keep every core busy on one long
prompt, large enough that the per-piece cost (a Python ``Encoding`` object) stays negligible."""

_CUT = re.compile(r"(?<=[A-Za-z]) (?=[A-Za-z])")

_PROBES = (
    "The quick brown fox, it's said, jumps over 123 456 lazy dogs. Don't they?\n\nNew paragraph here",
    "def route(request): return min(replicas, key=lambda r: r.cost) if replicas else None",
    "Café naïve — “quotes” 東京 and 😀👍🏽 then ascii words again and more ascii words",
    "tabs\tand   runs of  spaces between words\r\nand lines end here\n",
    'JSON {"key": "some value", "other": [1, 2, 3]} with words after it and before it',
    "ALL CAPS WORDS AND Mixed Case Words and lowercase words in one line of text",
)


def cut(text: str, size: int) -> list[str]:
    """``text`` in pieces of at least ``size`` characters (the last may be shorter), each cut at
    the first safe point past ``size``."""
    return cut_before(text, _CUT, size)


def cuts_are_exact(tokenizer: Tokenizer, encode: Callable[[str], list[int]]) -> bool:
    """Self-test: every probe cut at every safe point tokenizes as the whole probe does, and no
    added token has a safe point inside it."""
    if any(_CUT.search(token.content) for token in tokenizer.get_added_tokens_decoder().values()):
        return False
    for probe in _PROBES:
        pieces = cut(probe, 1)
        spliced = [token_id for piece in pieces for token_id in encode(piece)]
        if len(pieces) < 2 or spliced != encode(probe):
            return False
    return True
