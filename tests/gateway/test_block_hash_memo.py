"""Memoized block hashes are the hashes of the whole prompt, bit for bit, and skip known prefixes."""

import asyncio
from array import array

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.block_hash_memo import BlockHashMemo
from normalize.chat_tokenizer import ChatTokenizer
from normalize.segment_tokenizer import EncodedPrompt, KnownPrefix, SegmentTokenizer
from radix.hashing import TOKEN_ID_LIMIT, block_hashes

MODEL = "smollm2-135m"

segments = st.lists(st.integers(0, TOKEN_ID_LIMIT - 1), max_size=40)
prompts = st.lists(
    st.tuples(
        st.lists(st.sampled_from(range(6)), min_size=1, max_size=6),
        st.sampled_from([None, "", "tenant-a", "tenant-b"]),
        st.sampled_from([None, "adapter-x"]),
        st.integers(0, 6),
    ),
    min_size=1,
    max_size=8,
)


def known_prefixes(pieces: list[list[int]], known: int) -> list[KnownPrefix]:
    """The prefixes ending after each of the first ``known`` segments, keyed by their tokens."""
    prefixes = []
    tokens: list[int] = []
    for piece in pieces[:known]:
        tokens += piece
        prefixes.append((len(tokens), xxhash.xxh3_128_intdigest(array("I", tokens).tobytes())))
    return prefixes


@settings(max_examples=200, deadline=None)
@given(pool=st.lists(segments, min_size=6, max_size=6), requests=prompts, block_size=st.sampled_from([1, 3, 16]))
def test_memoized_hashes_equal_direct_hashes(
    pool: list[list[int]], requests: list[tuple[list[int], str | None, str | None, int]], block_size: int
) -> None:
    """Random prompts cut into random segments from a shared pool (so prefixes repeat), with
    random salts, adapters and numbers of known segments, through one memo."""
    memo = BlockHashMemo()
    for choice, salt, adapter, known in requests:
        pieces = [pool[index] for index in choice]
        ids = [token for piece in pieces for token in piece]
        prompt = EncodedPrompt(ids, known_prefixes(pieces, known))
        expected = block_hashes(ids, block_size, MODEL, salt, adapter)
        assert memo.block_hashes(prompt, block_size, MODEL, salt, adapter) == expected
        assert memo.block_hashes(prompt, block_size, MODEL, salt, adapter) == expected


def test_a_known_prefix_is_hashed_once() -> None:
    system = list(range(1000, 1000 + 16 * 40 + 5))
    memo = BlockHashMemo()
    for question in range(3):
        ids = system + [question] * 40
        prompt = EncodedPrompt(ids, known_prefixes([system], 1))
        before = memo.hashed_blocks
        assert memo.block_hashes(prompt, 16, MODEL) == block_hashes(ids, 16, MODEL)
        assert memo.hashed_blocks - before == (len(ids) // 16 if question == 0 else len(ids) // 16 - 40)
    assert memo.reused_blocks == 2 * 40


def test_salts_and_adapters_never_share_entries() -> None:
    ids = list(range(64))
    prompt = EncodedPrompt(ids, known_prefixes([ids], 1))
    memo = BlockHashMemo()
    for salt, adapter in [(None, None), ("a", None), (None, "lora"), ("a", "lora")]:
        assert memo.block_hashes(prompt, 16, MODEL, salt, adapter) == block_hashes(ids, 16, MODEL, salt, adapter)
    assert memo.reused_blocks == 0


def test_memo_stays_within_its_bytes() -> None:
    memo = BlockHashMemo(capacity_bytes=20_000)
    for index in range(100):
        ids = [index] * 16 * 20
        memo.block_hashes(EncodedPrompt(ids, known_prefixes([ids], 1)), 16, MODEL)
        assert memo._cache.bytes <= 20_000


texts = st.text(st.sampled_from("ab \n.é<|>"), max_size=60)
conversations = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": texts}),
    min_size=1,
    max_size=5,
)


@pytest.fixture(scope="module")
def tokenizer() -> SegmentTokenizer:
    return SegmentTokenizer(ChatTokenizer.load(MODEL))


@settings(max_examples=150, deadline=None)
@given(history=st.lists(conversations, min_size=1, max_size=4), salt=st.sampled_from([None, "s"]))
def test_tokenizer_known_prefixes_give_the_whole_prompt_hashes(
    tokenizer: SegmentTokenizer, history: list[list[dict[str, str]]], salt: str | None
) -> None:
    """The known prefixes the segment tokenizer reports name their tokens: growing conversations
    (each turn re-sends the earlier ones) hash through the memo as the whole prompt hashes."""
    memo = BlockHashMemo()
    messages: list[dict[str, str]] = []
    for turn in history:
        messages = messages + turn
        prompt = asyncio.run(tokenizer.encode_prompt_async(tokenizer.render_chat(messages), salt))
        assert prompt.ids == tokenizer.chat.encode_chat(messages)
        assert all(a[0] < b[0] for a, b in zip(prompt.known_prefixes, prompt.known_prefixes[1:], strict=False))
        assert memo.block_hashes(prompt, 4, MODEL, salt) == block_hashes(prompt.ids, 4, MODEL, salt)


raw_prompts = st.lists(
    st.sampled_from(["a", "b c", "\n", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]), max_size=6
).map("".join)


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(raw_prompts, min_size=1, max_size=8), block_size=st.sampled_from([1, 2]))
def test_special_tokens_between_known_segments_are_part_of_the_key(
    tokenizer: SegmentTokenizer, texts: list[str], block_size: int
) -> None:
    """Prompts that share their text pieces but not the special tokens between them never share entries."""
    memo = BlockHashMemo()
    for text in texts + texts:
        prompt = asyncio.run(tokenizer.encode_prompt_async(text))
        assert memo.block_hashes(prompt, block_size, MODEL) == block_hashes(prompt.ids, block_size, MODEL)
