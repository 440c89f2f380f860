"""Approximate pseudo-tokens: deterministic, prefix-preserving, usable by block hashing."""

from normalize.text_blocks import CHUNK_CHARS, approximate_chat_text, approximate_token_ids
from radix.hashing import block_hashes


def test_one_id_per_chunk_and_deterministic() -> None:
    text = "Café 東京 😀 " * 10
    ids = approximate_token_ids(text)
    assert len(ids) == -(-len(text) // CHUNK_CHARS)
    assert ids == approximate_token_ids(text)
    assert all(0 <= token < 2**32 for token in ids)
    assert approximate_token_ids("") == []


def test_shared_text_prefix_shares_blocks() -> None:
    stable = "You are a helpful assistant. " * 20
    first = block_hashes(approximate_token_ids(stable + "first question"), 16, "m")
    second = block_hashes(approximate_token_ids(stable + "another question entirely"), 16, "m")
    full_blocks = len(stable) // (16 * CHUNK_CHARS)
    assert first[:full_blocks] == second[:full_blocks]
    assert approximate_token_ids("abc") != approximate_token_ids("abc\x00")
    assert approximate_token_ids("abcd")[0] != approximate_token_ids("abdc")[0]


def test_chat_text_orders_tools_then_messages() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    text = approximate_chat_text(messages, [{"type": "function"}])
    assert text == '[{"type":"function"}]\n<system>\nBe brief.\n<user>\n[{"type":"text","text":"hi"}]\n'
