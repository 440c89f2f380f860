"""The tokenizer pipeline transformers 5.17 writes when it converts SmolLM2's GGUF (5.25 writes
the plain one kvgate keeps): for tests of what reads a tokenizer's JSON."""

from typing import Any

GGUF_517_DECODER = {
    "type": "Sequence",
    "decoders": [
        {"type": "ByteFallback"},
        {"type": "Fuse"},
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    ],
}


def as_converted_by_517(plain: dict[str, Any]) -> dict[str, Any]:
    """``plain`` (a byte-level BPE tokenizer's JSON) as 5.17's GGUF conversion spells it."""
    model = {**plain["model"], "byte_fallback": True, "unk_token": "<|endoftext|>", "fuse_unk": True}
    normalizer = {"type": "Sequence", "normalizers": []}
    return {**plain, "normalizer": normalizer, "model": model, "decoder": GGUF_517_DECODER}
