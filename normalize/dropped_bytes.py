"""Bytes a byte-level BPE tokenizer drops: its vocabulary has no entry for them, so they produce
no token at all (SmolLM2's lacks six ASCII control characters, 0x04, 0x06, 0x13, 0x14, 0x16 and
0x1d). A lower bound on a text's token count must not count them."""

from tokenizers import Tokenizer

_PROBES = (
    *range(0x801),
    *range(0x1000, 0x10000, 0x1000),
    *range(0x10000, 0x110000, 0x40000),
)
"""Code points whose UTF-8 forms hold every byte valid UTF-8 uses: one- and two-byte forms whole,
and each lead byte of the three- and four-byte forms (U+D000, not a surrogate, for 0xED)."""


def dropped_bytes(tokenizer: Tokenizer) -> bytes:
    """The byte values ``tokenizer`` drops, found by spelling each through its pre-tokenizer and
    looking the spelling up in its vocabulary; empty for a tokenizer that is not byte-level."""
    if type(tokenizer.decoder).__name__ != "ByteLevel" or tokenizer.pre_tokenizer is None:
        return b""
    spelling: dict[int, str] = {}
    for code in _PROBES:
        char = chr(code)
        data = char.encode()
        pieces = tokenizer.pre_tokenizer.pre_tokenize_str(char)
        if len(pieces) != 1 or len(pieces[0][0]) != len(data):
            continue
        for value, spelled in zip(data, pieces[0][0], strict=True):
            spelling.setdefault(value, spelled)
    return bytes(sorted(value for value, spelled in spelling.items() if tokenizer.token_to_id(spelled) is None))
