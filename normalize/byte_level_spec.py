"""A byte-level BPE tokenizer's JSON in its plain form, whichever transformers version wrote it.

transformers 5.17 converts a GGUF's GPT-2-style BPE tokenizer (the bundled SmolLM2's) into a
pipeline that differs from the one 5.25 writes and the model's own ``tokenizer.json`` ships:

- an empty normalizer ``Sequence`` where there is none;
- ``byte_fallback`` with ``<|endoftext|>`` as the unknown token, so a character whose byte has no
  token (six ASCII control characters in SmolLM2's vocabulary) becomes ``<|endoftext|>`` instead
  of nothing;
- the decoder chain ``ByteFallback, Fuse, Replace, ByteLevel`` where ``ByteLevel`` alone decodes.

HF tokenizes ordinary text to the same ids through either. But whatever reads the pipeline from
the JSON misreads 5.17's: llguidance took ``Ġ`` as text (structured outputs failed mid-answer), and
kvgate's fast tokenizer paths (normalize/tiktoken_bpe.py, normalize/byte_level_words.py) declined
it, so the gateway tokenized with HF alone (``python -m bench.micro.normalize_cost``: a cold 4,108-token
chat prompt 7.3 ms against 1.2 ms, a 28,500-token prompt in pieces 63 ms against 7 ms).
"""

from typing import Any

_EMPTY_NORMALIZER = {"type": "Sequence", "normalizers": []}


def is_byte_level(spec: dict[str, Any]) -> bool:
    """A BPE model behind GPT-2's byte-level pre-tokenizer: every token is spelled in its byte alphabet."""
    pre_tokenizer, model = spec.get("pre_tokenizer") or {}, spec.get("model") or {}
    return pre_tokenizer.get("type") == "ByteLevel" and model.get("type") == "BPE"


def with_plain_decoder(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with a byte-level tokenizer's decoder chain replaced by its ``ByteLevel`` step, which
    alone maps the byte alphabet back to bytes (the other steps change nothing such a token spells)."""
    decoder = spec.get("decoder") or {}
    chain = decoder.get("decoders", []) if decoder.get("type") == "Sequence" else []
    byte_level = next((step for step in chain if step.get("type") == "ByteLevel"), None)
    if not is_byte_level(spec) or byte_level is None:
        return spec
    return {**spec, "decoder": byte_level}


def plain_byte_level(spec: dict[str, Any]) -> dict[str, Any]:
    """A byte-level BPE tokenizer as 5.25 and the model's own files write it: no normalizer, no byte
    fallback or unknown token (a byte without a token gives none), a plain ``ByteLevel`` decoder.
    Any other tokenizer is returned as is."""
    if not is_byte_level(spec):
        return spec
    plain = with_plain_decoder(spec)
    if plain.get("normalizer") == _EMPTY_NORMALIZER:
        plain = {**plain, "normalizer": None}
    model = {**plain["model"], "byte_fallback": False, "unk_token": None, "fuse_unk": False}
    return {**plain, "model": model}
