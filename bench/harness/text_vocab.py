"""Token ids whose text round-trips exactly, so a token-id prompt can be sent as text.

Peers such as sglang-router take text prompts only. Drawing synthetic prompts from tokens that
are a space plus ASCII letters and encode back to themselves makes ``decode`` then ``encode`` of
any sequence of them the identity, so text and token-id contenders compute the same tokens.
"""

from bench.workloads.token_blocks import FIRST_ORDINARY_TOKEN
from normalize.chat_tokenizer import ChatTokenizer


def round_trip_vocab(tokenizer: ChatTokenizer) -> list[int]:
    vocab = []
    for token_id in range(FIRST_ORDINARY_TOKEN, tokenizer.vocab_size):
        piece = tokenizer.decode([token_id])
        word = piece[1:]
        if piece.startswith(" ") and word.isascii() and word.isalpha() and tokenizer.encode_text(piece) == [token_id]:
            vocab.append(token_id)
    return vocab
