"""Request bodies the tests send: one model name and one chat builder for in-process and end-to-end tests."""

from typing import Any

MODEL = "smollm2-135m"


def chat(
    content: str = "Say hello.", max_tokens: int = 8, *, system: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A chat completion body with one user message (after ``system``, when given)."""
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages.append({"role": "user", "content": content})
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens, **extra}
