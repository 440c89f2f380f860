"""Per-request token caps: prompt, max_tokens (reject or clamp), context length."""

import pytest

from gateway.admission.caps import RequestCaps, TokenGrant
from gateway.admission.config import LimitsConfig, TokenCaps
from gateway.errors import OpenAIError


def caps(reported: int | None = None, **limits: object) -> RequestCaps:
    return RequestCaps(LimitsConfig.model_validate(limits), lambda model: reported)


def test_no_limits_passes_the_request_through() -> None:
    assert caps().check("m", TokenCaps(), 100, 50, 256) == TokenGrant(50)
    assert caps().check("m", TokenCaps(), 100, None, 256) == TokenGrant(256)


def test_prompt_over_the_cap_is_rejected_with_both_numbers() -> None:
    with pytest.raises(OpenAIError) as error:
        caps(max_prompt_tokens=100).check("m", TokenCaps(), 101, 10, 256)
    assert error.value.status == 400
    assert "101" in error.value.message and "100" in error.value.message


def test_max_tokens_over_the_cap_is_rejected_or_clamped() -> None:
    with pytest.raises(OpenAIError) as error:
        caps(max_tokens=64).check("m", TokenCaps(), 10, 100, 256)
    assert error.value.param == "max_tokens"
    assert caps(max_tokens=64, max_tokens_policy="clamp").check("m", TokenCaps(), 10, 100, 256) == TokenGrant(64)


def test_absent_max_tokens_is_granted_the_cap() -> None:
    assert caps(max_tokens=64).check("m", TokenCaps(), 10, None, 256) == TokenGrant(64)


def test_context_length_from_config_or_replicas() -> None:
    with pytest.raises(OpenAIError) as error:
        caps(context_length=100).check("m", TokenCaps(), 60, 50, 256)
    assert error.value.code == "context_length_exceeded"
    assert "100" in error.value.message and "110" in error.value.message
    with pytest.raises(OpenAIError):
        caps(reported=100).check("m", TokenCaps(), 100, None, 256)
    assert caps(reported=100).check("m", TokenCaps(), 60, None, 256) == TokenGrant(40)


def test_model_and_tenant_overrides_narrow_the_defaults() -> None:
    limits = caps(max_tokens=100, models={"small": {"max_tokens": 10}})
    assert limits.check("big", TokenCaps(), 1, 50, 256).max_tokens == 50
    with pytest.raises(OpenAIError):
        limits.check("small", TokenCaps(), 1, 50, 256)
    tenant = TokenCaps(max_tokens=5, max_tokens_policy="clamp")
    assert limits.check("big", tenant, 1, 50, 256) == TokenGrant(5)


def test_prompt_bound_before_tokenizing_uses_the_tightest_limit() -> None:
    assert caps().prompt_bound("m", TokenCaps()).limit is None
    assert caps(reported=2048).prompt_bound("m", TokenCaps()).limit == 2047
    assert caps(reported=2048, max_prompt_tokens=100).prompt_bound("m", TokenCaps(max_prompt_tokens=50)).limit == 50
    caps(max_prompt_tokens=100).prompt_bound("m", TokenCaps()).check(100)
    with pytest.raises(OpenAIError) as error:
        caps(max_prompt_tokens=100).prompt_bound("m", TokenCaps()).check(101)
    assert error.value.code == "prompt_too_long" and "at least 101" in error.value.message


def test_max_n_is_a_400_at_any_level_and_never_clamped() -> None:
    tenant = TokenCaps(max_n=2)
    assert caps(max_n=4).check("m", TokenCaps(), 10, 8, 256, n=4) == TokenGrant(8)
    for limits, tenant_caps, n in (
        ({"max_n": 4}, TokenCaps(), 5),
        ({}, tenant, 3),
        ({"max_tokens_policy": "clamp"}, tenant, 3),
    ):
        with pytest.raises(OpenAIError) as error:
            caps(**limits).check("m", tenant_caps, 10, 8, 256, n=n)
        assert (error.value.param, error.value.code) == ("n", "n_too_large")


def test_embeddings_inputs_together_are_capped() -> None:
    caps().check_prompt("m", TokenCaps(), 300_000, 500)
    with pytest.raises(OpenAIError) as error:
        caps().check_prompt("m", TokenCaps(), 300_001, 500)
    assert (error.value.param, error.value.code) == ("input", "too_many_input_tokens")
    caps(max_embedding_input_tokens=10**6).check_prompt("m", TokenCaps(), 10**6, 500)
