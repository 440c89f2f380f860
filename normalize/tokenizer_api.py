"""The bodies of vLLM's tokenizer endpoints (``/tokenize``, ``/detokenize``, ``/tokenizer_info``)
for one model's tokenizer. CPU work: callers run these off the event loop."""

import json
from typing import Any

from normalize.chat_tokenizer import ChatTokenizer, TemplateError
from protocol.openai import text_of
from protocol.openai_errors import bad_request
from protocol.tokenize_api import DetokenizeRequest, TokenizeChatRequest, TokenizeRequest


def tokenize_text(request: TokenizeRequest, tokenizer: ChatTokenizer) -> str:
    """The text ``/tokenize`` encodes: the prompt, or the messages rendered by the chat template."""
    if not isinstance(request, TokenizeChatRequest):
        return request.prompt
    messages = [
        {**message.model_dump(exclude_none=True), "content": text_of(message.content)}
        if isinstance(message.content, list)
        else message.model_dump(exclude_none=True)
        for message in request.messages
    ]
    try:
        return tokenizer.render_chat(messages, request.tools, add_generation_prompt=request.add_generation_prompt)
    except TemplateError as exc:
        raise bad_request(str(exc), "messages") from None


def tokenize_body(
    request: TokenizeRequest, text: str, tokenizer: ChatTokenizer, max_model_len: int | None
) -> dict[str, Any]:
    """vLLM's ``TokenizeResponse``: ``count``, ``max_model_len``, ``tokens`` and, when asked, ``token_strs``."""
    # encode_batch releases the GIL while it works (encode holds it, stopping the caller's event loop).
    encoding = tokenizer.tokenizer.encode_batch([text], add_special_tokens=request.add_special_tokens)[0]
    return {
        "count": len(encoding.ids),
        "max_model_len": max_model_len,
        "tokens": encoding.ids,
        "token_strs": encoding.tokens if request.return_token_strs else None,
    }


def detokenize_body(request: DetokenizeRequest, tokenizer: ChatTokenizer) -> dict[str, Any]:
    """vLLM's ``DetokenizeResponse``: ``{"prompt": text}``; an id outside the vocabulary is a 400."""
    vocab_size = tokenizer.vocab_size
    if any(not 0 <= token_id < vocab_size for token_id in request.tokens):
        raise bad_request(f"tokens must be token ids in [0, {vocab_size})", "tokens", "invalid_value")
    return {"prompt": tokenizer.decode(request.tokens, skip_special_tokens=False)}


def tokenizer_info(tokenizer: ChatTokenizer) -> dict[str, Any]:
    """vLLM's ``TokenizerInfoResponse``: the tokenizer's ``tokenizer_config.json``, special tokens as
    text, with ``tokenizer_class`` and the chat template in use (lm-eval's remote tokenizer reads it)."""
    config: dict[str, Any] = json.loads((tokenizer.folder / "tokenizer_config.json").read_text())
    config.pop("added_tokens_decoder", None)
    config = {key: value for key, value in config.items() if not _past_int64(value)}
    config |= {key: value for key, value in tokenizer.special_tokens.items() if value is not None}
    config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    if tokenizer.chat_template:
        config["chat_template"] = tokenizer.chat_template
    return config


def _past_int64(value: Any) -> bool:
    """An integer JSON encoders refuse (HF writes ``model_max_length`` 1e30 for "no limit")."""
    return isinstance(value, int) and not -(1 << 63) <= value < (1 << 63)
