"""A byte-level BPE tokenizer run by tiktoken: the HF tokenizer's ids, 5-10x faster.

tiktoken (OpenAI's Rust BPE) splits text with a regex and merges bytes by rank, as the HF
tokenizers GPT-2, Llama 3, Qwen and SmolLM2 ship do, and it releases the GIL while it works.
Its rules differ from HF's in three places, so a tokenizer is run by it only when all agree:
- tiktoken merges the pair that makes the lowest id, HF the pair earliest in its merge list:
  each merge must make a higher id than the one before.
- tiktoken takes a word that is itself in the vocabulary as that one token. HF does the same
  only with ``ignore_merges``; otherwise every vocabulary entry must come out of HF's merges as
  itself (checked over the whole vocabulary, ~0.25 s for 49k entries, once a host: see
  ``tiktoken_for_file``).
- tiktoken knows no added tokens: a text containing one (``<|im_start|>`` ...) is left to HF.
  So is a text with a character that has a byte without a token (HF drops it; tiktoken cannot):
  in SmolLM2's vocabulary a few ASCII control characters and the unassigned planes 4-11.
The rest (no normalizer, byte-level regex pre-tokenizer, plain BPE: no byte fallback, dropout
or subword affixes) is read from the tokenizer's JSON, and a probe self-test compares both on
sample text before tiktoken is trusted (tests/normalize/test_tiktoken_bpe.py compares them on
random text).
"""

import json
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path
from typing import Any

import tiktoken
import tokenizers
import xxhash
from tokenizers import Tokenizer, models

from normalize.model_files import cache_root

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
"""The split HF's ByteLevel pre-tokenizer applies with ``use_regex`` (GPT-2's)."""

_NEVER_IN_UTF8 = frozenset([0xC0, 0xC1, *range(0xF5, 0x100)])


def _byte_level_chars() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character that spells each byte in the vocabulary."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [value for value in range(256) if value not in printable]
    spelled = {chr(value): value for value in printable}
    spelled.update({chr(256 + index): value for index, value in enumerate(others)})
    return spelled


_BYTE_OF_CHAR = _byte_level_chars()
_TO_BYTES = {value: "\uffff" for value in range(0x200)} | {
    ord(char): chr(value) for char, value in _BYTE_OF_CHAR.items()
}
"""Spells an entry's bytes as Latin-1 characters; a character outside the alphabet becomes one
Latin-1 cannot encode, so the entry is left out."""


class TiktokenBpe:
    """tiktoken with an HF tokenizer's vocabulary and split, for texts without added tokens."""

    def __init__(self, encoding: tiktoken.Encoding, added: tuple[str, ...], untokenized: tuple[bytes, ...]) -> None:
        self._encoding = encoding
        self._added = added
        self._untokenized = untokenized
        """Bytes without a token: ASCII characters, or lead bytes of the characters they start
        (a UTF-8 byte below 0x80 is always a character of its own, a lead byte never a continuation)."""

    @classmethod
    def for_tokenizer(
        cls, tokenizer: Tokenizer, probes: Iterable[str], vocabulary_checked: bool = False
    ) -> "TiktokenBpe | None":
        """The same tokenizer run by tiktoken; None where the rules differ or a probe disagrees.
        ``vocabulary_checked``: this tokenizer passed the whole-vocabulary check before."""
        model = tokenizer.model
        pre_tokenizer = tokenizer.pre_tokenizer
        pattern = _split_pattern(json.loads(pre_tokenizer.__getstate__())) if pre_tokenizer is not None else None
        if tokenizer.normalizer is not None or not isinstance(model, models.BPE) or pattern is None:
            return None
        state = json.loads(model.__getstate__())
        if any(
            state.get(key) for key in ("dropout", "byte_fallback", "continuing_subword_prefix", "end_of_word_suffix")
        ):
            return None
        added = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
        vocab = {entry: token_id for entry, token_id in state["vocab"].items() if entry not in added}
        ranks = _byte_ranks(vocab)
        untokenized = {value for value in range(256) if bytes([value]) not in ranks} - _NEVER_IN_UTF8
        if any(0x80 <= value < 0xC2 for value in untokenized) or not _merges_in_id_order(state):
            return None
        if not (state.get("ignore_merges") or vocabulary_checked or _vocabulary_merges_to_itself(model, vocab)):
            return None
        encoding = tiktoken.Encoding("kvgate-bpe", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
        bpe = cls(encoding, tuple(added), tuple(bytes([value]) for value in sorted(untokenized)))
        for probe in probes:
            if bpe.encode(probe) not in (None, tokenizer.encode(probe, add_special_tokens=False).ids):
                return None
        return bpe

    def without_added_tokens(self) -> "TiktokenBpe":
        """The same, for text with every added token cut out before (the segment tokenizer's),
        so none is looked for (2 ms on a 220 KB text for SmolLM2's 17)."""
        return TiktokenBpe(self._encoding, (), self._untokenized)

    def encode(self, text: str) -> list[int] | None:
        """``text``'s ids, or None when it holds an added token or an untokenized character (HF's).
        The checks are substring searches (memchr): a regex over 220 KB cost 8 ms, all these 0.3."""
        if self._untokenized:
            encoded = text.encode("utf-8", "surrogatepass")
            if any(value in encoded for value in self._untokenized):
                return None
        if any(content in text for content in self._added):
            return None
        return self._encoding.encode_ordinary(text)


_BY_FILE: dict[tuple[str, int, int], TiktokenBpe | None] = {}


def tiktoken_for_file(path: Path, tokenizer: Tokenizer, probes: Iterable[str]) -> TiktokenBpe | None:
    """``TiktokenBpe.for_tokenizer`` of ``tokenizer``, loaded from ``path``: once per file a process
    (a process builds a tokenizer per served model and per reload), and the whole-vocabulary check
    (~0.25 s) once per file content and library versions a host: a marker file in kvgate's cache
    says it passed."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _BY_FILE:
        marker = _checked_marker(path)
        bpe = TiktokenBpe.for_tokenizer(tokenizer, probes, vocabulary_checked=marker.exists())
        if bpe is not None:
            with suppress(OSError):
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.touch()
        _BY_FILE[key] = bpe
    return _BY_FILE[key]


def _checked_marker(path: Path) -> Path:
    versions = f"{tiktoken.__version__} {tokenizers.__version__}".encode()
    return cache_root() / "tiktoken-checked" / xxhash.xxh3_128_hexdigest(path.read_bytes() + versions)


def _split_pattern(pre_tokenizer: dict[str, Any] | None) -> str | None:
    """The regex tiktoken should split with: GPT-2's for a regex ByteLevel, or an isolating Split's
    before a ByteLevel that does not split again (Llama 3, Qwen)."""
    if pre_tokenizer is None:
        return None
    if pre_tokenizer.get("type") == "ByteLevel":
        plain = pre_tokenizer.get("use_regex", True) and not pre_tokenizer.get("add_prefix_space")
        return GPT2_PATTERN if plain else None
    steps = pre_tokenizer.get("pretokenizers") if pre_tokenizer.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        return None
    split, byte_level = steps
    regex = split.get("pattern", {}).get("Regex") if split.get("type") == "Split" else None
    isolating = split.get("behavior") == "Isolated" and not split.get("invert")
    plain = byte_level.get("type") == "ByteLevel" and not byte_level.get("use_regex", True)
    return regex if regex and isolating and plain and not byte_level.get("add_prefix_space") else None


def _byte_ranks(vocab: dict[str, int]) -> dict[bytes, int]:
    """The vocabulary as bytes to id (entries not spelled in the byte alphabet left out)."""
    ranks: dict[bytes, int] = {}
    for entry, token_id in vocab.items():
        with suppress(UnicodeEncodeError):
            ranks[entry.translate(_TO_BYTES).encode("latin-1")] = token_id
    return ranks


def _merges_in_id_order(state: dict[str, Any]) -> bool:
    """Whether each merge makes a token with a higher id than the merge before: tiktoken ranks a
    merge by the id of what it makes, HF by its place in the list."""
    vocab = state["vocab"]
    last = -1
    for merge in state["merges"]:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        token_id = vocab.get(left + right)
        if token_id is None or token_id <= last:
            return False
        last = token_id
    return True


def _vocabulary_merges_to_itself(model: models.BPE, vocab: dict[str, int]) -> bool:
    """Whether HF's merges turn each vocabulary entry's bytes back into that one entry."""
    for entry, token_id in vocab.items():
        tokens = model.tokenize(entry)
        if len(tokens) != 1 or tokens[0].id != token_id:
            return False
    return True
