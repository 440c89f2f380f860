"""How long the gateway asks a bundled engine to retain a session (issue 29): OpenAI's
``prompt_cache_retention`` and Anthropic's ``cache_control.ttl`` become ``kvgate_session_ttl_s``
beside the session key; other values are a 400 naming the field. No processes."""

from typing import Any

import pytest

from gateway.admission.forwarded_body import with_retention_hint, without_retention_hint
from gateway.anthropic.request import chat_body
from gateway.routing.cache_keys import check_cache_retention, session_ttl_s
from protocol.anthropic import MessagesRequest, validate_anthropic
from protocol.openai_errors import OpenAIError


@pytest.mark.parametrize(
    ("body", "ttl_s"),
    [
        ({}, None),
        ({"prompt_cache_retention": "in_memory"}, None),
        ({"prompt_cache_retention": "24h"}, 86400.0),
        ({"prompt_cache_retention": "24h", "kvgate_session_ttl_s": 600}, 600.0),
    ],
)
def test_the_requested_ttl(body: dict[str, Any], ttl_s: float | None) -> None:
    check_cache_retention(body)
    assert session_ttl_s(body) == ttl_s


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt_cache_retention": "forever"}, "prompt_cache_retention"),
        ({"prompt_cache_retention": ["24h"]}, "prompt_cache_retention"),
        ({"kvgate_session_ttl_s": 0}, "kvgate_session_ttl_s"),
        ({"kvgate_session_ttl_s": True}, "kvgate_session_ttl_s"),
        ({"kvgate_session_ttl_s": float("inf")}, "kvgate_session_ttl_s"),
        ({"kvgate_session_ttl_s": "1h"}, "kvgate_session_ttl_s"),
    ],
)
def test_other_values_are_a_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as refused:
        check_cache_retention(body)
    assert refused.value.status == 400 and refused.value.param == param


def test_the_ttl_travels_beside_the_session_key_and_only_with_it() -> None:
    body = {"prompt": "x", "prompt_cache_retention": "24h"}
    hinted = with_retention_hint(body, "ns:k")
    assert hinted == {**body, "kvgate_session": "ns:k", "kvgate_session_ttl_s": 86400.0}
    assert with_retention_hint({"prompt": "x", "kvgate_session_ttl_s": 5}, None) == {"prompt": "x"}
    assert with_retention_hint({"prompt": "x"}, "ns:k") == {"prompt": "x", "kvgate_session": "ns:k"}


def test_a_backend_without_retention_hints_gets_no_ttl() -> None:
    body = {"prompt": "x", "kvgate_session_ttl_s": 3600.0}
    assert without_retention_hint(body) == {"prompt": "x"}
    plain = {"prompt": "x"}
    assert without_retention_hint(plain) is plain


@pytest.mark.parametrize(("ttl", "seconds"), [("5m", 300.0), ("1h", 3600.0), (None, 300.0)])
def test_anthropic_cache_control_ttl_becomes_the_session_ttl(ttl: str | None, seconds: float) -> None:
    cache_control: dict[str, str] = {"type": "ephemeral"} if ttl is None else {"type": "ephemeral", "ttl": ttl}
    system = [{"type": "text", "text": "long rules", "cache_control": cache_control}]
    body = {"model": "m", "max_tokens": 8, "system": system, "messages": [{"role": "user", "content": "hi"}]}
    translated = chat_body(validate_anthropic(body, MessagesRequest)).body
    assert translated["kvgate_session_ttl_s"] == seconds
    assert translated["user"], "a breakpoint names a session"


def test_anthropic_without_cache_control_asks_for_no_ttl() -> None:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    assert "kvgate_session_ttl_s" not in chat_body(validate_anthropic(body, MessagesRequest)).body
