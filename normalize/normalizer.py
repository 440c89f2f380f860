"""Brings a request to its canonical form before it is hashed and forwarded.

The rules own only the parts that form shared prefixes: messages whose role is listed in
``normalize.roles`` (system and developer by default), tool definitions, and, where configured,
a completions prompt. A Responses body gets the same rules: its ``instructions`` are the system
message they are rendered as, its ``input`` message items are messages (a plain-text ``input``
is a user message). Everything else, ``cache_salt`` included, is forwarded as sent. The input
body is never mutated; unchanged messages are shared with it.
"""

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from normalize.config import NormalizeConfig
from normalize.text_rules import TEXT_RULES, TextRule
from normalize.tool_rules import keys_sorted, sort_keys_recursively, tool_name
from normalize.volatile_spans import VolatileSpans, volatile_note

_EARLY_RULES = ("invisible_chars", "nfc", "line_endings")
_LATE_RULES = ("trailing_whitespace", "collapse_spaces")
RULE_ORDER = (*_EARLY_RULES, "volatile_spans", *_LATE_RULES, "strip_message", "canonical_tools", "sort_tools")
"""Every rule name, in the order the rules run and are reported."""
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
"""Content part types that carry text: chat's ``text``, the Responses API's input and output text."""
OFFLOAD_CHARS = 32_768
"""A body with more text than this (or more than ``OFFLOAD_TOOLS`` tools) is normalized on a worker
thread by ``apply_async``: the rules run in slices there (normalize/nfc.py, the volatile-span regex
lets go of the GIL), so the event loop keeps running while they work."""
OFFLOAD_TOOLS = 32


@dataclass(frozen=True)
class NormalizedRequest:
    body: dict[str, Any]
    """The canonical body to hash and forward: a new dict, or the sent one when no rule changed it."""
    changed: list[str]
    """Names of the rules that changed something, in ``RULE_ORDER``."""


class Normalizer:
    """Applies the configured rules to a parsed OpenAI request body."""

    def __init__(self, config: NormalizeConfig) -> None:
        self.config = config
        rules = config.rules
        self._roles = frozenset(config.roles)
        self._early: list[tuple[str, TextRule]] = [
            (name, TEXT_RULES[name]) for name in _EARLY_RULES if getattr(rules, name)
        ]
        self._late: list[tuple[str, TextRule]] = [
            (name, TEXT_RULES[name]) for name in _LATE_RULES if getattr(rules, name)
        ]
        patterns = config.volatile_patterns()
        self._volatile = VolatileSpans(patterns) if rules.volatile_spans and patterns else None

    def apply(self, body: dict[str, Any], *, responses: bool = False) -> NormalizedRequest:
        """``responses``: the body is a Responses request (its ``input`` is messages, not embedding inputs).

        ``body`` is never mutated; it comes back itself (not copied) when no rule changed it."""
        if not self.config.enabled:
            return NormalizedRequest(body, [])
        canonical: dict[str, Any] = {}
        changed: set[str] = set()
        messages = body.get("messages")
        if isinstance(messages, list):
            canonical["messages"] = [self._message(message, changed) for message in messages]
        tools = body.get("tools")
        if isinstance(tools, list):
            canonical["tools"] = self._tools(tools, changed)
        prompt = body.get("prompt")
        if self.config.completions_prompt and isinstance(prompt, str):
            canonical["prompt"] = self._prompt(prompt, changed)
        if responses:
            self._responses(body, canonical, changed)
        if not changed:
            return NormalizedRequest(body, [])
        return NormalizedRequest({**body, **canonical}, [name for name in RULE_ORDER if name in changed])

    async def apply_async(self, body: dict[str, Any], *, responses: bool = False) -> NormalizedRequest:
        """``apply``, on a worker thread when the body is large."""
        if self.config.enabled and self._is_large(body, responses):
            return await asyncio.to_thread(self.apply, body, responses=responses)
        return self.apply(body, responses=responses)

    def _responses(self, body: dict[str, Any], canonical: dict[str, Any], changed: set[str]) -> None:
        """A Responses body's ``instructions`` and ``input``, as the chat messages they are rendered as;
        each is the sent object itself when no rule changed it."""
        instructions = body.get("instructions")
        if isinstance(instructions, str) and "system" in self._roles:
            canonical["instructions"] = self._whole_text(instructions, changed)
        items = body.get("input")
        if isinstance(items, str) and "user" in self._roles:
            canonical["input"] = self._whole_text(items, changed)
        elif isinstance(items, list):
            items_now = [self._message(item, changed) for item in items]
            if any(now is not item for now, item in zip(items_now, items, strict=True)):
                canonical["input"] = items_now

    def _message(self, message: Any, changed: set[str]) -> Any:
        if not isinstance(message, dict) or message.get("role") not in self._roles:
            return message
        content = message.get("content")
        if isinstance(content, str):
            canonical: str | list[Any] = self._whole_text(content, changed)
        elif isinstance(content, list):
            canonical = self._parts(content, changed)
        else:
            return message
        return message if canonical is content else {**message, "content": canonical}

    def _whole_text(self, text: str, changed: set[str]) -> str:
        canonical, values = self._text(text, changed, 1)
        if self.config.rules.strip_message:
            canonical = _applied("strip_message", str.strip, canonical, changed)
        return canonical + volatile_note(values) if values else canonical

    def _parts(self, parts: list[Any], changed: set[str]) -> list[Any]:
        """Content given as parts: text rules per text part; the message's ends are the first and
        last parts when those are text; the volatile note goes after the last text part."""
        text_at = [
            index
            for index, part in enumerate(parts)
            if isinstance(part, dict) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str)
        ]
        if not text_at:
            return parts
        texts: dict[int, str] = {}
        values: list[str] = []
        for index in text_at:
            texts[index], found = self._text(parts[index]["text"], changed, len(values) + 1)
            values += found
        if self.config.rules.strip_message:
            if text_at[0] == 0:
                texts[0] = _applied("strip_message", str.lstrip, texts[0], changed)
            if text_at[-1] == len(parts) - 1:
                texts[text_at[-1]] = _applied("strip_message", str.rstrip, texts[text_at[-1]], changed)
        if values:
            texts[text_at[-1]] += volatile_note(values)
        if all(texts[index] is parts[index]["text"] for index in text_at):
            return parts
        return [{**part, "text": texts[index]} if index in texts else part for index, part in enumerate(parts)]

    def _prompt(self, prompt: str, changed: set[str]) -> str:
        """A completions prompt gets the character rules only: the model continues right where it
        ends, so its whitespace is content, and a volatile note would move that point."""
        for name, rule in self._early:
            prompt = _applied(name, rule, prompt, changed)
        return prompt

    def _text(self, text: str, changed: set[str], first_number: int) -> tuple[str, list[str]]:
        """The text rules in order; returns the text and the volatile values taken out of it."""
        for name, rule in self._early:
            text = _applied(name, rule, text, changed)
        values: list[str] = []
        if self._volatile is not None:
            text, values = self._volatile.extract(text, first_number)
            if values:
                changed.add("volatile_spans")
        for name, rule in self._late:
            text = _applied(name, rule, text, changed)
        return text, values

    def _is_large(self, body: dict[str, Any], responses: bool) -> bool:
        """Whether the texts the rules read are longer than ``OFFLOAD_CHARS`` together (or the tools
        many): the messages of the normalized roles, a completions prompt where configured, a
        Responses body's instructions and input. A long message of another role (a user's pasted
        document) is never read, so it costs the loop nothing and a thread hop here would."""
        tools = body.get("tools")
        if isinstance(tools, list) and len(tools) > OFFLOAD_TOOLS:
            return True
        chars = sum(_text_chars(message.get("content")) for message in self._ruled(body.get("messages")))
        prompt = body.get("prompt")
        if self.config.completions_prompt and isinstance(prompt, str):
            chars += len(prompt)
        if responses:
            chars += _text_chars(body.get("instructions")) if "system" in self._roles else 0
            items = body.get("input")
            if isinstance(items, str):
                chars += len(items) if "user" in self._roles else 0
            else:
                chars += sum(_text_chars(item.get("content")) for item in self._ruled(items))
        return chars > OFFLOAD_CHARS

    def _ruled(self, messages: Any) -> list[dict[str, Any]]:
        """The messages (or Responses input items) the rules read: those of a normalized role."""
        if not isinstance(messages, list):
            return []
        return [message for message in messages if isinstance(message, dict) and message.get("role") in self._roles]

    def _tools(self, tools: list[Any], changed: set[str]) -> list[Any]:
        canonical = tools
        if self.config.rules.canonical_tools and not keys_sorted(tools):
            canonical = sort_keys_recursively(tools)
            changed.add("canonical_tools")
        if self.config.rules.sort_tools:
            ordered = sorted(canonical, key=tool_name)
            if any(a is not b for a, b in zip(ordered, canonical, strict=True)):
                canonical = ordered
                changed.add("sort_tools")
        return canonical


def _text_chars(value: Any) -> int:
    """Characters of a text, of text parts, or of message items (one level: what the rules read)."""
    if isinstance(value, str):
        return len(value)
    if not isinstance(value, list):
        return 0
    chars = 0
    for item in value:
        if isinstance(item, str):
            chars += len(item)
        elif isinstance(item, dict):
            chars += _text_chars(item.get("text", item.get("content")))
    return chars


def _applied(name: str, rule: Callable[[str], str], text: str, changed: set[str]) -> str:
    """``rule(text)``, recording ``name`` in ``changed`` when it changed the text."""
    result = rule(text)
    if result is not text and result != text:
        changed.add(name)
        return result
    return text
