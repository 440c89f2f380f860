"""Segment-cached tokenization equals whole-prompt tokenization, stays bounded, and offloads."""

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, pre_tokenizers

from normalize.byte_lru import ByteLRU
from normalize.chat_tokenizer import ChatTokenizer
from normalize.segment_tokenizer import OFFLOAD_CHARS, SegmentTokenizer

T = TypeVar("T")

FRAGMENTS = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "\n",
    "\r\n",
    " ",
    "  ",
    "\t",
    "é",
    "e\u0301",
    "東京",
    "😀",
    "👨\u200d👩\u200d👧",
    "ß",
    "'s",
    "123",
]
texts = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.text(st.characters(exclude_categories=("Cs",)), max_size=12)), max_size=8
).map("".join)
conversations = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": texts}),
    min_size=1,
    max_size=6,
)
property_settings = settings(max_examples=300, deadline=None)


@pytest.fixture(scope="module")
def shared_tokenizer(chat_tokenizer: ChatTokenizer) -> SegmentTokenizer:
    """One cache across examples, so later examples splice cached segments of earlier ones."""
    return SegmentTokenizer(chat_tokenizer)


@property_settings
@given(conversation=conversations)
def test_chat_equals_whole_prompt_tokenization(
    chat_tokenizer: ChatTokenizer, shared_tokenizer: SegmentTokenizer, conversation: list[dict[str, str]]
) -> None:
    assert shared_tokenizer.segmented
    expected = chat_tokenizer.encode_chat(conversation)
    assert shared_tokenizer.encode_chat(conversation) == expected
    assert shared_tokenizer.encode_chat(conversation) == expected


@property_settings
@given(prompt=texts)
def test_prompt_equals_whole_tokenization(
    chat_tokenizer: ChatTokenizer, shared_tokenizer: SegmentTokenizer, prompt: str
) -> None:
    assert shared_tokenizer.encode_prompt(prompt) == chat_tokenizer.encode_text(prompt)


def test_turn_k_tokenizes_only_what_is_new(chat_tokenizer: ChatTokenizer) -> None:
    tokenizer = SegmentTokenizer(chat_tokenizer)
    messages = [{"role": "system", "content": "You are a careful assistant. " * 50}]
    tokenizer.encode_chat(messages)
    for turn in range(5):
        messages += [
            {"role": "user", "content": f"question {turn}"},
            {"role": "assistant", "content": f"answer {turn}"},
        ]
        before = tokenizer.stats()
        assert tokenizer.encode_chat(messages) == chat_tokenizer.encode_chat(messages)
        after = tokenizer.stats()
        assert after["misses"] - before["misses"] == 2
        old_messages = len(messages) - 2
        assert after["hits"] - before["hits"] == old_messages + 2, "old turns, the separator, the generation prompt"


def test_cache_bytes_stay_bounded(chat_tokenizer: ChatTokenizer) -> None:
    tokenizer = SegmentTokenizer(chat_tokenizer, cache_bytes=20_000)
    for index in range(200):
        messages = [{"role": "system", "content": f"System prompt number {index}: " + "lorem ipsum " * 20}]
        assert tokenizer.encode_chat(messages) == chat_tokenizer.encode_chat(messages)
        assert tokenizer.stats()["bytes"] <= 20_000
    assert 0 < tokenizer.stats()["entries"] < 200


def test_byte_lru_evicts_least_recently_used() -> None:
    cache: ByteLRU[str, str] = ByteLRU(10, len)
    cache.put("a", "xxxx")
    cache.put("b", "xxxx")
    assert cache.get("a") == "xxxx"
    cache.put("c", "xxxx")
    assert cache.get("b") is None and cache.get("a") == "xxxx" and cache.bytes == 8
    cache.put("a", "x")
    assert cache.bytes == 5
    cache.put("huge", "x" * 11)
    assert cache.get("huge") is None and len(cache) == 2


def test_unsafe_tokenizer_is_detected_and_tokenized_whole(tokenizer_copy: Callable[..., ChatTokenizer]) -> None:
    """A pre-tokenizer that marks only the start of the input treats segments differently."""

    def first_piece_marker(tokenizer: Tokenizer) -> None:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Metaspace(prepend_scheme="first"), tokenizer.pre_tokenizer]
        )

    chat = tokenizer_copy(edit=first_piece_marker)
    tokenizer = SegmentTokenizer(chat)
    assert not tokenizer.segmented
    messages = [{"role": "system", "content": "hello"}, {"role": "user", "content": "world"}]
    assert tokenizer.encode_chat(messages) == chat.encode_chat(messages)
    assert tokenizer.stats()["entries"] == 1


class RecordingTokenizer:
    """The real ``tokenizers.Tokenizer``, recording which method ran on which thread."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str]] = []
        self.batch_sizes: list[int] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def encode(self, *args: object, **kwargs: object) -> object:
        self.calls.append(("encode", threading.current_thread().name))
        return self.inner.encode(*args, **kwargs)

    def encode_batch(self, texts: list[str], **kwargs: object) -> object:
        self.calls.append(("encode_batch", threading.current_thread().name))
        self.batch_sizes.append(len(texts))
        return self.inner.encode_batch(texts, **kwargs)


def recorded_tokenizer(chat_tokenizer: ChatTokenizer, tiktoken: bool) -> tuple[SegmentTokenizer, RecordingTokenizer]:
    """A segment tokenizer whose HF tokenizer records its calls."""
    chat = ChatTokenizer(chat_tokenizer.folder)
    recording = RecordingTokenizer(chat.tokenizer)
    chat.tokenizer = recording
    tokenizer = SegmentTokenizer(chat, tiktoken=tiktoken)
    tokenizer.encode_chat([{"role": "user", "content": "warm the separators"}])
    recording.calls.clear()
    recording.batch_sizes.clear()
    return tokenizer, recording


@pytest.fixture
def recorded(chat_tokenizer: ChatTokenizer) -> Iterator[tuple[SegmentTokenizer, RecordingTokenizer]]:
    """Without tiktoken: every text goes to the HF tokenizer."""
    tokenizer, recording = recorded_tokenizer(chat_tokenizer, tiktoken=False)
    yield tokenizer, recording
    tokenizer.close()


async def prompt_ids(tokenizer: SegmentTokenizer, text: str) -> list[int]:
    return (await tokenizer.encode_prompt_async(text)).ids


async def ticks_while(coroutine: Awaitable[list[int]]) -> tuple[list[int], int]:
    """The coroutine's result and how often another task ran on the loop meanwhile."""
    ticks = 0
    done = False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    ticks = 0
    result = await coroutine
    done = True
    await task
    return result, ticks


async def test_long_uncached_text_is_tokenized_off_the_loop(
    chat_tokenizer: ChatTokenizer, recorded: tuple[SegmentTokenizer, RecordingTokenizer]
) -> None:
    tokenizer, recording = recorded
    short = [{"role": "user", "content": "hi"}]
    long = [{"role": "system", "content": "x y " * OFFLOAD_CHARS}]

    ids, ticks = await ticks_while(tokenizer.encode_chat_async(short))
    assert ids == chat_tokenizer.encode_chat(short) and ticks == 0
    assert all(thread == "MainThread" for _, thread in recording.calls)

    recording.calls.clear()
    ids, ticks = await ticks_while(tokenizer.encode_chat_async(long))
    assert ids == chat_tokenizer.encode_chat(long) and ticks > 0
    assert recording.calls == [("encode_batch", "kvgate-tokenize_0")]

    recording.calls.clear()
    assert await tokenizer.encode_chat_async(long) == ids
    assert recording.calls == []


async def test_concurrent_requests_share_one_tokenization(
    chat_tokenizer: ChatTokenizer, recorded: tuple[SegmentTokenizer, RecordingTokenizer]
) -> None:
    tokenizer, recording = recorded
    system = {"role": "system", "content": "A brand new system prompt. " * 200}
    conversations = [[system, {"role": "user", "content": f"question {index}"}] for index in range(5)]
    results = await asyncio.gather(*(tokenizer.encode_chat_async(messages) for messages in conversations))
    assert results == [chat_tokenizer.encode_chat(messages) for messages in conversations]
    assert recording.calls.count(("encode_batch", "kvgate-tokenize_0")) == 1


async def test_a_long_text_is_tokenized_in_pieces_in_one_batch(
    chat_tokenizer: ChatTokenizer, recorded: tuple[SegmentTokenizer, RecordingTokenizer]
) -> None:
    """One long prompt goes to ``encode_batch`` in pieces (spread over every core), spliced exactly."""
    tokenizer, recording = recorded
    assert tokenizer.chunk_chars is not None
    words = ["routing", "prefix", "cache", "replica", "tokens,", "it's", "42", "times:", "\n"]
    text = " ".join(words[index % len(words)] for index in range(6 * tokenizer.chunk_chars // 5))
    ids = (await tokenizer.encode_prompt_async(text)).ids
    assert ids == chat_tokenizer.encode_text(text)
    assert recording.calls == [("encode_batch", "kvgate-tokenize_0")]
    assert recording.batch_sizes[0] >= 4


async def test_tiktoken_tokenizes_long_text_off_the_loop_without_the_hf_tokenizer(
    chat_tokenizer: ChatTokenizer,
) -> None:
    tokenizer, recording = recorded_tokenizer(chat_tokenizer, tiktoken=True)
    try:
        words = ["Prefix", "caches,", "routed", "replicas:", "1,024", "tokens", "each", "—", "café", "東京", "😀.\n"]
        text = " ".join(words[index % len(words)] for index in range(2 * tokenizer.chunk_chars // 3))
        ids, ticks = await ticks_while(prompt_ids(tokenizer, text))
        assert ids == chat_tokenizer.encode_text(text) and ticks > 0
        assert recording.calls == []
        with_added = text + "<|im_start|>" + text[:100]
        assert tokenizer.encode_prompt(with_added) == chat_tokenizer.encode_text(with_added)
        one_piece_for_hf = text[: len(text) // 2] + "\x04" + text[len(text) // 2 :]
        ids = await prompt_ids(tokenizer, one_piece_for_hf)
        assert ids == chat_tokenizer.tokenizer.encode(one_piece_for_hf, add_special_tokens=False).ids
        assert recording.batch_sizes == [1], "only the piece with the untokenized byte went to HF"
    finally:
        tokenizer.close()


async def longest_loop_pause(coroutine: Awaitable[T]) -> tuple[T, float]:
    """The coroutine's result, and the longest the event loop went without running another task
    meanwhile."""
    pauses: list[float] = []
    done = False

    async def ticker() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0)
            now = time.perf_counter()
            pauses.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    result = await coroutine
    done = True
    await task
    return result, max(pauses)


async def least_loop_pause(start: Callable[[], Awaitable[T]], tries: int = 3) -> tuple[T, float]:
    """The result, and the shortest of ``tries`` runs' longest pauses: work that holds the GIL pauses
    the loop on every run, the OS descheduling the loop on a busy machine only on some (CI's other
    test worker shares the two cores)."""
    runs = [await longest_loop_pause(start()) for _ in range(tries)]
    return runs[0][0], min(pause for _, pause in runs)


async def test_the_hf_tokenizer_on_a_worker_thread_leaves_the_loop_running(chat_tokenizer: ChatTokenizer) -> None:
    """``ChatTokenizer.encode_text`` (the engine's tokenizer, run with ``asyncio.to_thread``) must not
    hold the GIL: the loop's longest pause while a long prompt is tokenized on a thread stays far
    below the tokenization's own time (HF's ``encode`` held it: the pause was the whole time)."""
    text = "Prefix caches, routed replicas: café 東京. " * 12_000
    started = time.perf_counter()
    expected = chat_tokenizer.tokenizer.encode(text, add_special_tokens=False).ids
    alone_s = time.perf_counter() - started
    ids, pause_s = await least_loop_pause(lambda: asyncio.to_thread(chat_tokenizer.encode_text, text))
    assert ids == expected
    assert pause_s < alone_s / 2, (pause_s, alone_s)


async def test_detokenizing_on_a_worker_thread_leaves_the_loop_running(chat_tokenizer: ChatTokenizer) -> None:
    """``ChatTokenizer.decode`` (/detokenize, an echoed prompt) must not hold the GIL either."""
    token_ids = chat_tokenizer.encode_text("Prefix caches, routed replicas: café 東京. " * 40_000)
    started = time.perf_counter()
    expected = chat_tokenizer.tokenizer.decode(token_ids, skip_special_tokens=True)
    alone_s = time.perf_counter() - started
    text, pause_s = await least_loop_pause(lambda: asyncio.to_thread(chat_tokenizer.decode, token_ids))
    assert text == expected
    assert pause_s < alone_s / 2, (pause_s, alone_s)
