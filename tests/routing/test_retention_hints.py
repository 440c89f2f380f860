"""Retention hints: the session key goes to bundled engines as ``kvgate_session``, scoped to the
client's tenant and cache salt; a client's own ``kvgate_session`` never reaches an engine as is."""

import pytest

from engine.core.session_retention import namespace_of
from gateway.admission.caps import TokenGrant
from gateway.admission.forwarded_body import forwarded_body, with_retention_hint
from gateway.backends.circuit_breaker import CircuitBreaker
from gateway.backends.pool import Backend
from gateway.config import BackendSpec, HealthConfig
from gateway.routing.retention_keys import (
    INFERRED,
    client_session_key,
    retention_hint,
    scoped_key,
    tenant_namespace,
)
from gateway.routing.types import RouteDecision, RouteRequest
from protocol.replica_stats import ReplicaStats

STATS = ReplicaStats(
    ts=0.0,
    running=0,
    waiting=0,
    block_size=16,
    num_blocks=64,
    free_blocks=64,
    cached_free_blocks=0,
    cached_blocks=0,
    num_preemptions=0,
    max_num_seqs=8,
    max_num_batched_tokens=512,
)


def backend(retention_hints: bool | None, reported: ReplicaStats | None) -> Backend:
    spec = BackendSpec(name="r", url="http://127.0.0.1:1", retention_hints=retention_hints)
    return Backend(spec, "m", CircuitBreaker("r", HealthConfig()), reported=reported)


def test_the_session_key_is_written_into_a_copy_of_the_body() -> None:
    body = {"prompt": "x", "max_tokens": 4}
    hinted = with_retention_hint(body, "ns:user-7")
    assert hinted == {"prompt": "x", "max_tokens": 4, "kvgate_session": "ns:user-7"}
    assert body == {"prompt": "x", "max_tokens": 4}


def test_no_key_leaves_the_body_as_it_is() -> None:
    body = {"prompt": "x"}
    assert with_retention_hint(body, None) is body and with_retention_hint(body, "") is body


def test_a_clients_own_kvgate_session_is_not_forwarded() -> None:
    body = {"prompt": "x", "max_tokens": 4, "kvgate_session": "victims-chat"}
    assert "kvgate_session" not in forwarded_body(body, TokenGrant(4), None)


def test_two_tenants_naming_the_same_session_get_two_keys() -> None:
    victim = client_session_key("victim", "salt", "chat-1")
    assert victim is not None and victim == client_session_key("victim", "salt", "chat-1")
    assert victim != client_session_key("attacker", "salt", "chat-1")
    assert victim != client_session_key("victim", None, "chat-1")
    assert victim != client_session_key("victim", "other", "chat-1")


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (("a:b", None, "c"), ("a", None, "b:c")),
        (("a\x00b", "c", "d"), ("a", "b\x00c", "d")),
        (("t", "s\x00client\x00k", "x"), ("t", "s", "k")),
        (("t", "", "k"), ("t", None, "k")),
    ],
)
def test_no_client_string_can_pass_for_another_field(
    first: tuple[str, str | None, str], second: tuple[str, str | None, str]
) -> None:
    """The key is a digest of structured fields, never of a joined string a separator could fake."""
    assert client_session_key(*first) != client_session_key(*second)


def test_an_inferred_key_never_equals_a_client_key_of_the_same_text() -> None:
    assert scoped_key("t", None, INFERRED, "prefix:00ab") != client_session_key("t", None, "prefix:00ab")


def test_the_engine_reads_the_tenant_namespace_from_the_key() -> None:
    """Every key of one tenant, whatever its salt or kind, is in the tenant's namespace at the engine."""
    namespace = tenant_namespace("victim")
    keys = [client_session_key("victim", salt, "chat") for salt in (None, "s1", "s2")]
    keys.append(scoped_key("victim", None, INFERRED, "prefix:1"))
    assert {namespace_of(key or "") for key in keys} == {namespace}
    assert namespace_of(client_session_key("attacker", None, "chat") or "") != namespace


def test_only_a_non_empty_string_names_a_session() -> None:
    assert client_session_key("t", None, None) is None
    assert client_session_key("t", None, "") is None
    assert client_session_key("t", None, 7) is None


def test_the_hint_is_the_scoped_client_key_else_the_scoped_inferred_one() -> None:
    decision = RouteDecision("r", "prefix-hit", 0, ["r"], None, "prefix:00ff")
    keyed = RouteRequest("id", "m", [], 1, 1, session_key="ns:client", tenant="t")
    assert retention_hint(keyed, decision) == "ns:client"
    unkeyed = RouteRequest("id", "m", [], 1, 1, cache_salt="s", tenant="t")
    assert retention_hint(unkeyed, decision) == scoped_key("t", "s", INFERRED, "prefix:00ff")
    other = RouteRequest("id", "m", [], 1, 1, cache_salt="s", tenant="u")
    assert retention_hint(other, decision) != retention_hint(unkeyed, decision)
    none = RouteDecision("r", "prefix-hit", 0, ["r"], None, None)
    assert retention_hint(unkeyed, none) is None


@pytest.mark.parametrize(
    ("configured", "reported", "expected"),
    [
        (None, STATS, True),
        (None, None, False),
        (False, STATS, False),
        (True, None, True),
    ],
)
def test_bundled_engines_get_hints_by_default_and_config_decides_otherwise(
    configured: bool | None, reported: ReplicaStats | None, expected: bool
) -> None:
    assert backend(configured, reported).takes_retention_hints is expected
