"""Grammar-constrained decoding with llguidance: compiled grammars, per-sequence matchers, token masks.

llguidance was chosen by measurement on SmolLM2's 49k vocabulary (docs/structured_outputs.md):
a 7.7 MB wheel with no dependencies, about 1 ms to compile a JSON schema, a median of 12 us per
token mask, and an error naming each JSON-schema keyword it cannot enforce (``not``, ``if`` ...),
where xgrammar accepted and ignored them and pulled in triton.

A ``Grammar`` is checked once per request, on a worker thread, so a bad one is a 400 before the
engine sees it. Each sequence gets its own ``GrammarMatcher``, which follows its sampled tokens; the
runner fills the masks of a step's constrained sequences with ``fill_masks`` while the forward runs.
"""

import json
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.numpy
import numpy as np
import numpy.typing as npt

from normalize.byte_level_spec import with_plain_decoder
from normalize.chat_tokenizer import ChatTokenizer
from protocol.openai_errors import OpenAIError, bad_request

JSON_FORMAT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
"""JSON as ``json.dumps`` writes it: one space after ``:`` and ``,``, no newlines, the form a small
model has seen most (and no room to pad an answer with endless whitespace)."""

Bitmask = npt.NDArray[np.int32]


@dataclass(frozen=True)
class Grammar:
    """A checked llguidance grammar (its serialized form) and the request field it came from."""

    serialized: str
    param: str
    tokenizer: llguidance.LLTokenizer

    def matcher(self) -> "GrammarMatcher":
        return GrammarMatcher(llguidance.LLMatcher(self.tokenizer, self.serialized), self.tokenizer.vocab_size)


class GrammarMatcher:
    """One sequence's place in its grammar: which tokens may come next, and whether it is complete."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self.vocab_size = vocab_size
        """The tokenizer's vocabulary, the width of this matcher's masks."""

    def accept(self, token_id: int) -> None:
        """Advance past a sampled token (the mask allowed it, so this cannot fail unless unmasked)."""
        if not self._matcher.consume_token(token_id):
            raise RuntimeError(f"grammar rejected token {token_id}: {self._matcher.get_error()}")

    @property
    def complete(self) -> bool:
        """True once the grammar allows nothing but the end of the sequence."""
        return bool(self._matcher.is_stopped())

    @property
    def llmatcher(self) -> llguidance.LLMatcher:
        return self._matcher


def llguidance_tokenizer_json(serialized: str) -> str:
    """The tokenizer's JSON as llguidance reads token bytes from it: a byte-level BPE tokenizer's
    decoder made plain ``ByteLevel`` (normalize/byte_level_spec.py).

    llguidance takes a token's bytes from the decoder: only a top-level ``ByteLevel`` decoder makes
    it map GPT-2's byte alphabet back to bytes. With the decoder chain transformers 5.17 writes, it
    read ``Ġ`` as its UTF-8 bytes, so no token could produce a space and a JSON schema's ``": "``
    failed mid-answer. kvgate's own GGUF conversion writes the plain form; this covers a model
    folder whose ``tokenizer.json`` chains it.
    """
    spec = json.loads(serialized)
    plain = with_plain_decoder(spec)
    return serialized if plain is spec else json.dumps(plain)


class GrammarCompiler:
    """Builds and checks grammars against one tokenizer (made once: about a second for 49k tokens)."""

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self.tokenizer = llguidance.LLTokenizer(
            llguidance_tokenizer_json(tokenizer.tokenizer.to_str()), eos_token=tokenizer.eos_token_id
        )
        self.vocab_size: int = self.tokenizer.vocab_size

    def json_schema(self, schema: dict[str, Any], param: str) -> Grammar:
        return self.lark(f"start: {json_rule(schema)}\n", param)

    def regex(self, pattern: str, param: str) -> Grammar:
        return self._checked(llguidance.LLMatcher.grammar_from_regex(pattern), param)

    def choice(self, options: list[str], param: str) -> Grammar:
        if not options:
            raise bad_request(f"'{param}' must list at least one choice", param)
        alternatives = " | ".join(json.dumps(option, ensure_ascii=False) for option in options)
        return self.lark(f"start: {alternatives}\n", param)

    def lark(self, grammar: str, param: str) -> Grammar:
        return self._checked(llguidance.LLMatcher.grammar_from_lark(grammar), param)

    def _checked(self, serialized: str, param: str) -> Grammar:
        error = llguidance.LLMatcher.validate_grammar(serialized, self.tokenizer)
        if error:
            raise OpenAIError(
                400, f"'{param}' cannot be enforced: {error.strip()}", param=param, code="unsupported_value"
            )
        return Grammar(serialized, param, self.tokenizer)


def json_rule(schema: dict[str, Any]) -> str:
    """A Lark rule body that matches JSON valid against ``schema``, in ``JSON_FORMAT``."""
    if not isinstance(schema, dict):
        raise bad_request("a JSON schema must be a JSON object", "response_format")
    options = {**JSON_FORMAT, **schema.get("x-guidance", {})}
    return "%json " + json.dumps({**schema, "x-guidance": options}, ensure_ascii=False)


class MaskFiller:
    """Computes a step's token masks on llguidance's own threads, with the GIL released."""

    def __init__(self) -> None:
        self._executor = llguidance.LLExecutor()

    def fill(self, matchers: list[GrammarMatcher], rows: list[int], bitmask: Bitmask) -> None:
        """Write each matcher's allowed tokens into its row of ``bitmask`` (bit i of word j: token 32j+i)."""
        pairs = [(matcher.llmatcher, row) for matcher, row in zip(matchers, rows, strict=True)]
        llguidance.numpy.fill_next_token_bitmask_par(self._executor, pairs, bitmask)


def allocate_bitmask(rows: int, vocab_size: int) -> Bitmask:
    """A mask allowing every token, ``rows`` x ceil(vocab / 32) words."""
    return llguidance.numpy.allocate_token_bitmask(rows, vocab_size)
