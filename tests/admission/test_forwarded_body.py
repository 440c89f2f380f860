from gateway.admission.caps import TokenGrant
from gateway.admission.forwarded_body import forwarded_body


def test_exactly_one_cap_is_forwarded_whatever_alias_the_client_used() -> None:
    for body in (
        {"prompt": "x", "max_completion_tokens": 2046},
        {"prompt": "x", "max_tokens": 5, "max_completion_tokens": 2046},
        {"prompt": "x"},
        {"messages": [], "max_completion_tokens": 500},
    ):
        forwarded = forwarded_body(body, TokenGrant(64), None)
        assert forwarded["max_tokens"] == 64 and "max_completion_tokens" not in forwarded


def test_granted_tokens_and_salt_are_written_into_a_copy() -> None:
    body = {"messages": [], "max_completion_tokens": 500}
    forwarded = forwarded_body(body, TokenGrant(64), "salt")
    assert forwarded == {"messages": [], "max_tokens": 64, "cache_salt": "salt"}
    assert body == {"messages": [], "max_completion_tokens": 500}


def test_a_salt_the_tenant_does_not_use_is_not_forwarded() -> None:
    assert "cache_salt" not in forwarded_body({"prompt": "x", "cache_salt": "s"}, TokenGrant(1), None)


def test_the_model_the_backend_knows_is_written_into_the_same_copy() -> None:
    body = {"model": "alias", "messages": [], "max_tokens": 5}
    forwarded = forwarded_body(body, TokenGrant(5), None, model="served")
    assert list(forwarded.items()) == [("model", "served"), ("messages", []), ("max_tokens", 5)]
    assert body["model"] == "alias"
