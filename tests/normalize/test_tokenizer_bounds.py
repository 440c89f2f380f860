"""The segment cache is per isolation domain, and ``min_tokens`` never exceeds the real count."""

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, normalizers

from normalize.chat_tokenizer import ChatTokenizer
from normalize.segment_tokenizer import SegmentTokenizer

WHITESPACE_RUNS = st.sampled_from(["\n" + " " * 80, " " * 200, "\t" * 30, "-" * 64, "=" * 40])
texts = st.lists(st.one_of(WHITESPACE_RUNS, st.text(max_size=40)), max_size=12).map("".join)


def test_a_salted_request_never_hits_another_domains_segments(chat_tokenizer: ChatTokenizer) -> None:
    tokenizer = SegmentTokenizer(chat_tokenizer)
    secret = [{"role": "system", "content": "The isolated tenant's confidential system prompt."}]
    ids = tokenizer.encode_chat(secret, salt="tenant-a")
    before = tokenizer.stats()
    assert tokenizer.encode_chat(secret) == ids
    assert tokenizer.encode_chat(secret, salt="tenant-b") == ids
    after = tokenizer.stats()
    assert after["hits"] == before["hits"], "no piece of another domain's prompt was a hit"
    pieces = (after["misses"] - before["misses"]) // 2
    tokenizer.encode_chat(secret, salt="tenant-a")
    assert tokenizer.stats()["hits"] - after["hits"] == pieces > 0, "its own domain still hits every piece"


@pytest.fixture(scope="module")
def segment_tokenizer(chat_tokenizer: ChatTokenizer) -> SegmentTokenizer:
    return SegmentTokenizer(chat_tokenizer)


@settings(max_examples=300, deadline=None)
@given(text=texts)
def test_min_tokens_is_a_lower_bound(
    chat_tokenizer: ChatTokenizer, segment_tokenizer: SegmentTokenizer, text: str
) -> None:
    assert segment_tokenizer.min_tokens(text) <= len(chat_tokenizer.encode_text(text))


def test_longest_token_of_the_bundled_byte_level_vocabulary(chat_tokenizer: ChatTokenizer) -> None:
    tokenizer = SegmentTokenizer(chat_tokenizer)
    longest = max(
        len(chat_tokenizer.decode([i], skip_special_tokens=False).encode()) for i in range(chat_tokenizer.vocab_size)
    )
    assert tokenizer.longest_token_bytes == longest
    assert tokenizer.min_tokens("x" * 8_000_000) == -(-8_000_000 // longest)


def test_a_normalizer_is_applied_before_the_bound(tokenizer_copy: Callable[..., ChatTokenizer]) -> None:
    """NFKC turns one three-byte ligature into two one-byte letters; the bound sees the result."""

    def nfkc(tokenizer: Tokenizer) -> None:
        tokenizer.normalizer = normalizers.NFKC()

    chat = tokenizer_copy(edit=nfkc)
    tokenizer = SegmentTokenizer(chat)
    text = "\U0000fb00" * 5000 + "ᄀ" + "\u1161" * 3
    assert tokenizer.min_tokens(text) <= len(chat.encode_text(text))


conversations = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": texts}),
    min_size=1,
    max_size=5,
)


@settings(max_examples=200, deadline=None)
@given(conversation=conversations)
def test_min_chat_tokens_bounds_the_rendered_chat_before_rendering(
    chat_tokenizer: ChatTokenizer, segment_tokenizer: SegmentTokenizer, conversation: list[dict[str, str]]
) -> None:
    assert segment_tokenizer.verbatim_roles == {"system", "developer", "user"}
    assert segment_tokenizer.min_chat_tokens(conversation) <= len(chat_tokenizer.encode_chat(conversation))


def test_a_template_that_drops_a_roles_content_leaves_that_role_out(
    tokenizer_copy: Callable[..., ChatTokenizer],
) -> None:
    template = (
        "{% for message in messages %}{% if message['role'] != 'system' %}"
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
        "{% endif %}{% endfor %}{{ '<|im_start|>assistant\n' }}"
    )
    tokenizer = SegmentTokenizer(tokenizer_copy(template=template))
    assert tokenizer.verbatim_roles == {"developer", "user"}
    assert tokenizer.min_chat_tokens([{"role": "system", "content": "x" * 10_000}]) == 0


def test_characters_the_tokenizer_drops_count_for_no_token(chat_tokenizer: ChatTokenizer) -> None:
    """SmolLM2's vocabulary has no entry for six ASCII control characters: they encode to nothing."""
    tokenizer = SegmentTokenizer(chat_tokenizer)
    dropped = "\x04\x06\x13\x14\x16\x1d"
    assert chat_tokenizer.encode_text(dropped * 50) == []
    assert tokenizer.min_tokens(dropped * 50) == 0
    assert "user" in tokenizer.verbatim_roles
    assert tokenizer.min_chat_tokens([{"role": "user", "content": dropped * 50}]) == 0
    assert tokenizer.min_chat_tokens([{"role": "user", "content": "x" * 9000}]) > 0
    assert tokenizer.min_tokens("a" + dropped) == 1
    mixed = ("é東" + dropped) * 500
    kept = -(-1000 // tokenizer.longest_token_bytes)
    assert tokenizer.min_chat_tokens([{"role": "user", "content": mixed}]) == kept, "characters, not bytes, kept"


DROPPED_ASCII = "\x04\x06\x13\x14\x16\x1d"
"""SmolLM2's dropped ASCII characters; U+50000 encodes with a lead byte (0xF1) it drops too."""


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(["x", "é", "東", "\U00050000", *DROPPED_ASCII]), max_size=300))
def test_dropped_characters_are_discounted_whichever_of_them_a_text_holds(
    segment_tokenizer: SegmentTokenizer, text: str
) -> None:
    """Only the dropped byte values the text holds are deleted before counting: any subset of them
    discounts exactly what deleting all of them would."""
    longest = segment_tokenizer.longest_token_bytes
    kept_chars = len(text) - sum(text.count(character) for character in DROPPED_ASCII)
    assert segment_tokenizer.min_chat_tokens([{"role": "user", "content": text}]) == -(-kept_chars // longest)
    kept_bytes = len(text.encode("utf-8").translate(None, DROPPED_ASCII.encode() + b"\xf1\xf2"))
    assert segment_tokenizer.min_tokens(text) == -(-kept_bytes // longest)
