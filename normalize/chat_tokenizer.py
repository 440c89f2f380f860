"""The served model's chat template and tokenizer, without importing torch or transformers.

Gateway and engine both render prompts through this class, so the tokens the gateway hashes are
exactly the tokens the engine computes. Rendering follows transformers' ``apply_chat_template``
(sandboxed Jinja with ``trim_blocks``/``lstrip_blocks``, ``raise_exception``, ``tojson`` and
``strftime_now``), and tokenization uses the HF fast tokenizer file itself.
"""

import json
from collections.abc import Sequence
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from normalize.model_files import resolve_model, tokenizer_dir
from normalize.tool_prompt import template_reads_tools, with_tools_rendered


class TemplateError(ValueError):
    """The chat template refused the messages (e.g. roles in an order it does not accept)."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format_string: str) -> str:
    return datetime.now().strftime(format_string)


class ChatTokenizer:
    """Chat-template rendering and tokenization for one model."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config = json.loads((folder / "tokenizer_config.json").read_text())
        self.special_tokens: dict[str, str | None] = {
            key: _token_text(config.get(key)) for key in ("bos_token", "eos_token", "pad_token", "unk_token")
        }
        template_file = folder / "chat_template.jinja"
        self.chat_template: str | None = (
            template_file.read_text() if template_file.is_file() else config.get("chat_template")
        )
        eos = self.special_tokens["eos_token"]
        self.eos_token_id: int | None = self.tokenizer.token_to_id(eos) if eos else None

    @classmethod
    def load(cls, name_or_path: str) -> "ChatTokenizer":
        """Tokenizer of a bundled model name, a GGUF file or an HF folder."""
        return cls(tokenizer_dir(resolve_model(name_or_path)))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @cached_property
    def _template(self) -> jinja2.Template:
        if not self.chat_template:
            raise TemplateError(f"the tokenizer in {self.folder} has no chat template")
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = _strftime_now
        return environment.from_string(self.chat_template)

    def render_chat(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text the model sees for these messages (tools in the system message when the
        template does not render them: ``normalize.tool_prompt``)."""
        if not template_reads_tools(self.chat_template):
            messages, tools = with_tools_rendered(messages, tools), None
        try:
            return self._template.render(
                messages=[_flatten_content(message) for message in messages],
                tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template failed: {exc}") from exc

    def encode_text(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """The HF tokenizer's ids. Through ``encode_batch``, which releases the GIL while it works:
        ``encode`` holds it, so on a worker thread it still stopped the event loop (~200 ms for a
        28k-token prompt on the engine's loop)."""
        return self.tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of the rendered chat prompt (the template carries its own special tokens)."""
        return self.encode_text(self.render_chat(messages, tools))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Through ``decode_batch``, which releases the GIL (``decode`` holds it: 200k ids, 74 ms)."""
        return self.tokenizer.decode_batch([list(token_ids)], skip_special_tokens=skip_special_tokens)[0]


def _flatten_content(message: dict[str, Any]) -> dict[str, Any]:
    """Join a message's text parts with newlines, as vLLM does, so templates see one string."""
    content = message.get("content")
    if isinstance(content, list):
        text = "\n".join(
            part.get("text") or "" for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
        return {**message, "content": text}
    if content is None:
        return {**message, "content": ""}
    return message


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value
