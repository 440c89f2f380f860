"""tiktoken runs the bundled tokenizer with HF's ids, and is refused where the two would differ."""

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from bench.harness.text_vocab import round_trip_vocab
from bench.workloads.token_blocks import random_tokens
from normalize import tiktoken_bpe
from normalize.chat_tokenizer import ChatTokenizer
from normalize.segment_tokenizer import SegmentTokenizer
from normalize.tiktoken_bpe import GPT2_PATTERN, TiktokenBpe, tiktoken_for_file

PROBES = ["Hello, world! It's 2026.", "  spaced\n\nlines\t", "café 東京 😀"]
LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
MIXED_SCRIPTS = [
    chr(code)
    for code in [*range(32, 127)] * 6
    + [9, 10, 13] * 20
    + [*range(0xA0, 0x250), *range(0x400, 0x450), *range(0x4E00, 0x4E40), *range(0x1F600, 0x1F610)]
    + [0x2019, 0x2018, 0x3000, 0x200B]
]


@pytest.fixture(scope="module")
def bpe(chat_tokenizer: ChatTokenizer) -> TiktokenBpe:
    found = TiktokenBpe.for_tokenizer(chat_tokenizer.tokenizer, PROBES)
    assert found is not None
    return found


def hf_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


@settings(max_examples=400, deadline=None)
@given(text=st.text(st.characters(exclude_categories=("Cs",)), max_size=300))
def test_any_text_gets_the_hf_ids_or_goes_to_hf(chat_tokenizer: ChatTokenizer, bpe: TiktokenBpe, text: str) -> None:
    ids = bpe.encode(text)
    assert ids is None or ids == hf_ids(chat_tokenizer.tokenizer, text)


def test_long_random_vocabulary_text_gets_the_hf_ids(chat_tokenizer: ChatTokenizer, bpe: TiktokenBpe) -> None:
    rng = random.Random(5)
    vocab = round_trip_vocab(chat_tokenizer)
    for _ in range(3):
        text = chat_tokenizer.decode(random_tokens(rng, 20_000, vocab))
        assert bpe.encode(text) == hf_ids(chat_tokenizer.tokenizer, text)


def test_added_tokens_and_untokenized_characters_go_to_hf(chat_tokenizer: ChatTokenizer, bpe: TiktokenBpe) -> None:
    """SmolLM2 has no token for byte 0x04 (HF drops it) nor for the lead byte of plane 4."""
    for text in ["a <|im_end|> b", "before\x04after", "plane four \U00040000 here"]:
        assert bpe.encode(text) is None
        segments = SegmentTokenizer(chat_tokenizer)
        assert segments.encode_prompt(text) == hf_ids(chat_tokenizer.tokenizer, text)
    assert bpe.encode("plane three \U00030000 here") == hf_ids(chat_tokenizer.tokenizer, "plane three \U00030000 here")


def edited(chat_tokenizer: ChatTokenizer, edit: Any) -> Tokenizer:
    spec = json.loads(chat_tokenizer.tokenizer.to_str())
    edit(spec)
    return Tokenizer.from_str(json.dumps(spec))


def split_first(pattern: str) -> Any:
    """The pre-tokenizer of Llama 3 and Qwen: their own regex, then bytes mapped without a split."""

    def edit(spec: dict[str, Any]) -> None:
        spec["pre_tokenizer"] = {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            ],
        }

    return edit


@pytest.mark.parametrize("pattern", [GPT2_PATTERN, LLAMA3_SPLIT, QWEN2_SPLIT], ids=["gpt2", "llama3", "qwen2"])
def test_an_isolating_split_regex_cuts_as_the_hf_tokenizer_does(chat_tokenizer: ChatTokenizer, pattern: str) -> None:
    """tiktoken's regex engine (fancy-regex) and HF's (Oniguruma) cut mixed text alike."""
    tokenizer = edited(chat_tokenizer, split_first(pattern))
    bpe = TiktokenBpe.for_tokenizer(tokenizer, PROBES)
    assert bpe is not None
    rng = random.Random(11)
    for _ in range(60):
        text = "".join(rng.choice(MIXED_SCRIPTS) for _ in range(rng.randint(1, 2000)))
        assert bpe.encode(text) == hf_ids(tokenizer, text)


def test_tokenizers_whose_rules_differ_are_refused(chat_tokenizer: ChatTokenizer) -> None:
    def lowercase(spec: dict[str, Any]) -> None:
        spec["normalizer"] = {"type": "Lowercase"}

    def metaspace(spec: dict[str, Any]) -> None:
        spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}

    def prefix_space(spec: dict[str, Any]) -> None:
        spec["pre_tokenizer"]["add_prefix_space"] = True

    def without_the_merge_of_the(spec: dict[str, Any]) -> None:
        """``Ġthe`` stays in the vocabulary, but HF can no longer make it; tiktoken would."""
        merges = spec["model"]["merges"]
        spec["model"]["merges"] = [
            merge for merge in merges if "".join(merge.split(" ") if isinstance(merge, str) else merge) != "Ġthe"
        ]
        assert len(spec["model"]["merges"]) == len(merges) - 1

    def merges_out_of_id_order(spec: dict[str, Any]) -> None:
        """HF would merge by list order, tiktoken by the id each merge makes."""
        merges = spec["model"]["merges"]
        merges[0], merges[1] = merges[1], merges[0]

    for edit in (lowercase, metaspace, prefix_space, without_the_merge_of_the, merges_out_of_id_order):
        assert TiktokenBpe.for_tokenizer(edited(chat_tokenizer, edit), PROBES) is None, edit.__name__


def test_the_segment_tokenizer_can_do_without_tiktoken(chat_tokenizer: ChatTokenizer) -> None:
    text = "The same ids either way, 東京 included."
    with_tiktoken, without = SegmentTokenizer(chat_tokenizer), SegmentTokenizer(chat_tokenizer, tiktoken=False)
    assert with_tiktoken.encode_prompt(text) == without.encode_prompt(text) == hf_ids(chat_tokenizer.tokenizer, text)


def test_the_vocabulary_check_runs_once_per_tokenizer_file(
    chat_tokenizer: ChatTokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its verdict is kept in kvgate's cache, keyed by the file's content: a new process trusts it."""
    monkeypatch.setenv("KVGATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tiktoken_bpe, "_BY_FILE", {})
    path = chat_tokenizer.folder / "tokenizer.json"
    assert tiktoken_for_file(path, chat_tokenizer.tokenizer, PROBES) is not None
    assert len(list((tmp_path / "cache" / "tiktoken-checked").iterdir())) == 1

    def must_not_run(*args: object) -> bool:
        raise AssertionError("checked again")

    monkeypatch.setattr(tiktoken_bpe, "_BY_FILE", {})
    monkeypatch.setattr(tiktoken_bpe, "_vocabulary_merges_to_itself", must_not_run)
    bpe = tiktoken_for_file(path, chat_tokenizer.tokenizer, PROBES)
    assert bpe is not None and bpe.encode("the same ids") == hf_ids(chat_tokenizer.tokenizer, "the same ids")
    edited_copy = tmp_path / "tokenizer.json"
    edited_copy.write_bytes(path.read_bytes() + b" ")
    with pytest.raises(AssertionError, match="checked again"):
        tiktoken_for_file(edited_copy, chat_tokenizer.tokenizer, PROBES)
