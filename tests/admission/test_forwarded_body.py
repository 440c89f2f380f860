from gateway.admission.caps import TokenGrant
from gateway.admission.forwarded_body import forwarded_body


def test_body_is_untouched_when_admission_changes_nothing() -> None:
    body = {"prompt": "x", "max_tokens": 5}
    assert forwarded_body(body, TokenGrant(5, forward=False), None) is body


def test_granted_tokens_and_salt_are_written_into_a_copy() -> None:
    body = {"messages": [], "max_completion_tokens": 500}
    forwarded = forwarded_body(body, TokenGrant(64, forward=True), "salt")
    assert forwarded == {"messages": [], "max_completion_tokens": 64, "cache_salt": "salt"}
    assert body == {"messages": [], "max_completion_tokens": 500}
    assert forwarded_body({"prompt": "x"}, TokenGrant(16, forward=True), None)["max_tokens"] == 16
