"""Retention hints: the client's session key goes to bundled engines as ``kvgate_session``."""

import pytest

from gateway.admission.forwarded_body import MAX_SESSION_HINT_CHARS, with_retention_hint
from gateway.backends.circuit_breaker import CircuitBreaker
from gateway.backends.pool import Backend
from gateway.config import BackendSpec, HealthConfig


def backend(retention_hints: bool | None, reported: dict) -> Backend:
    spec = BackendSpec(name="r", url="http://127.0.0.1:1", retention_hints=retention_hints)
    return Backend(spec, "m", CircuitBreaker("r", HealthConfig()), reported=reported)


def test_the_session_key_is_written_into_a_copy_of_the_body() -> None:
    body = {"prompt": "x", "max_tokens": 4}
    hinted = with_retention_hint(body, "user-7")
    assert hinted == {"prompt": "x", "max_tokens": 4, "kvgate_session": "user-7"}
    assert body == {"prompt": "x", "max_tokens": 4}


def test_no_key_leaves_the_body_as_it_is() -> None:
    body = {"prompt": "x"}
    assert with_retention_hint(body, None) is body and with_retention_hint(body, "") is body


def test_a_key_longer_than_the_engine_accepts_is_sent_as_a_stable_digest() -> None:
    key = "k" * (MAX_SESSION_HINT_CHARS + 1)
    hint = with_retention_hint({}, key)["kvgate_session"]
    assert len(hint) <= MAX_SESSION_HINT_CHARS and hint == with_retention_hint({}, key)["kvgate_session"]
    assert hint != with_retention_hint({}, key + "x")["kvgate_session"]


@pytest.mark.parametrize(
    ("configured", "reported", "expected"),
    [
        (None, {"num_blocks": 64, "running": 0}, True),
        (None, {}, False),
        (False, {"num_blocks": 64}, False),
        (True, {}, True),
    ],
)
def test_bundled_engines_get_hints_by_default_and_config_decides_otherwise(
    configured: bool | None, reported: dict, expected: bool
) -> None:
    assert backend(configured, reported).takes_retention_hints is expected
