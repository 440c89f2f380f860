"""Byte-level BPE tokenization of ASCII text word by word, with each word's ids cached.

A byte-level BPE tokenizer with GPT-2's pre-tokenizer (SmolLM2's; Llama 3 and Qwen cut words
with a regex of their own and do not qualify here) cuts its input into words with one regular
expression and runs BPE on each word alone, so a text's ids are its words' ids in order. The HF tokenizer spends most of its time on a short text in that cut (its
regex engine and the byte mapping, ~1.5 us a word here), not in BPE. For ASCII text the cut is
a plain ``re`` pattern (the Unicode classes of GPT-2's pattern are ``[A-Za-z]``, ``[0-9]`` and
the six ASCII whitespace characters there), and the words of ordinary text repeat, so their ids
come from a dict; a word not seen yet goes through the tokenizer's own BPE model. The dict starts
with every vocabulary entry that is one ASCII word (~50k for SmolLM2, ~0.1 s at load), so a
common word costs no BPE (~2 us a word) even the first time this process sees it.

Only a tokenizer whose whole pipeline is exactly that (no normalizer, a ``ByteLevel``
pre-tokenizer with GPT-2's regex and no prefix space, a BPE model without dropout, every added
token split off before this runs) qualifies, and only after a self-test at load time that
compares it with the tokenizer on every ASCII character in several contexts.

Only the vocabulary's words are shared by every request. A word learned from a request is kept
for the requests of the same isolation domain (its cache salt) alone: a hit is faster than a
miss, so a shared word would tell another tenant which words an isolated tenant sent.
"""

import json
import re
from collections import OrderedDict
from itertools import chain

from tokenizers import Tokenizer

_WHITESPACE = "\\t\\n\\x0b\\x0c\\r "
"""What GPT-2's ``\\s`` matches in ASCII (the tokenizer's regex engine; not \\x1c-\\x1f as Python's does)."""

ASCII_WORDS = re.compile(
    "'s|'t|'re|'ve|'m|'ll|'d"
    "| ?[A-Za-z]+| ?[0-9]+"
    f"| ?[^{_WHITESPACE}A-Za-z0-9]+"
    f"|[{_WHITESPACE}]+(?![^{_WHITESPACE}])|[{_WHITESPACE}]+"
)
"""GPT-2's pre-tokenizer pattern with its Unicode classes spelled out for ASCII."""

MAX_CACHED_WORD_CHARS = 64
"""Longer words (runs of punctuation or spaces, say) are tokenized each time, not cached."""
MAX_DOMAIN_WORDS = 25_000
"""A domain's learned words are emptied when they reach this many (~5 MB); vocabulary words stay."""
MAX_DOMAINS = 8
"""Isolation domains with learned words; the one used least recently is dropped for a new one."""

_SELF_TEST_CONTEXTS = ("{c}", "a{c}b", "a{c}{c}b", " {c} ", "1{c}{c}{c}", "{c}  x", "'{c}s", "{c}\n\n", "x.{c}'ll")


def _pipeline_qualifies(tokenizer: Tokenizer) -> bool:
    config = json.loads(tokenizer.to_str())
    pre = config.get("pre_tokenizer") or {}
    model = config.get("model") or {}
    return (
        config.get("normalizer") is None
        and pre.get("type") == "ByteLevel"
        and pre.get("use_regex") is True
        and pre.get("add_prefix_space") is False
        and model.get("type") == "BPE"
        and model.get("dropout") is None
        and not model.get("continuing_subword_prefix")
        and not model.get("end_of_word_suffix")
    )


class ByteLevelWords:
    """Not thread-safe: call it from one thread (the event loop)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._model = tokenizer.model
        self._byte_chars = str.maketrans(
            {code: tokenizer.pre_tokenizer.pre_tokenize_str(chr(code))[0][0] for code in range(128)}
        )
        """ASCII character -> the character the byte-level alphabet spells it with."""
        self._vocabulary: dict[str, tuple[int, ...]] = {}
        """Ids of the vocabulary's ASCII words, the same for every request. Tuples: the garbage
        collector stops tracking tuples of ints, so full caches cost no GC scans."""
        self._learned: OrderedDict[str | None, dict[str, tuple[int, ...]]] = OrderedDict()
        """Per isolation domain (cache salt; None: requests with none), the other words it has sent."""

    @classmethod
    def for_tokenizer(
        cls, tokenizer: Tokenizer, added_tokens_split: bool, entries_whole: bool = False
    ) -> "ByteLevelWords | None":
        """The word tokenizer when ``tokenizer``'s pipeline qualifies and agrees with it on the
        self-test, else None. ``added_tokens_split``: the caller cuts every added token out of
        the text first (the tokenizer matches them before its pre-tokenizer runs).
        ``entries_whole``: BPE is known to give every vocabulary entry as itself (checked by
        normalize/tiktoken_bpe.py), so the vocabulary's words need no BPE here (0.15 s a start)."""
        if not added_tokens_split or not _pipeline_qualifies(tokenizer):
            return None
        words = cls(tokenizer)
        probes = [context.format(c=chr(code)) for code in range(128) for context in _SELF_TEST_CONTEXTS]
        probes.append("".join(map(chr, range(128))))
        for probe in probes:
            if words.encode(probe) != tokenizer.encode(probe, add_special_tokens=False).ids:
                return None
        words._learned.clear()
        words._learn_vocabulary(tokenizer, entries_whole)
        return words

    def _learn_vocabulary(self, tokenizer: Tokenizer, entries_whole: bool) -> None:
        """Caches the ids of every vocabulary entry that spells one whole ASCII word: the entry
        itself when ``entries_whole``, else through ``_bpe`` like any word (BPE does not always
        give such a word its own entry)."""
        ascii_of = str.maketrans({char: chr(code) for code, char in self._byte_chars.items()})
        for entry, token_id in tokenizer.get_vocab(with_added_tokens=False).items():
            word = entry.translate(ascii_of)
            if word.isascii() and ASCII_WORDS.findall(word) == [word]:
                self._vocabulary[word] = (token_id,) if entries_whole else self._bpe(word)

    def encode(self, text: str, salt: str | None = None) -> list[int] | None:
        """The token ids of ``text``; None when it is not ASCII (the caller tokenizes it whole).
        ``salt``: the request's isolation domain, the only one whose learned words it may use."""
        if not text.isascii():
            return None
        vocabulary = self._vocabulary
        learned = self._domain(salt)
        return list(
            chain.from_iterable(
                [
                    vocabulary.get(word) or learned.get(word) or self._learn(word, learned)
                    for word in ASCII_WORDS.findall(text)
                ]
            )
        )

    def _domain(self, salt: str | None) -> dict[str, tuple[int, ...]]:
        learned = self._learned.get(salt)
        if learned is None:
            if len(self._learned) >= MAX_DOMAINS:
                self._learned.popitem(last=False)
            learned = self._learned[salt] = {}
        else:
            self._learned.move_to_end(salt)
        return learned

    def _learn(self, word: str, learned: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
        ids = self._bpe(word)
        if len(word) <= MAX_CACHED_WORD_CHARS:
            if len(learned) >= MAX_DOMAIN_WORDS:
                learned.clear()
            learned[word] = ids
        return ids

    def _bpe(self, word: str) -> tuple[int, ...]:
        return tuple([token.id for token in self._model.tokenize(word.translate(self._byte_chars))])
