"""protocol.usage: a backend's usage object read once, whatever it left out or got wrong."""

from protocol.usage import Usage, parse_usage, reported_cached_tokens


def test_a_full_usage_object_is_read_whole() -> None:
    wire = {
        "prompt_tokens": 9,
        "completion_tokens": 3,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 8},
    }
    assert parse_usage(wire) == Usage(prompt_tokens=9, completion_tokens=3, total_tokens=12, cached_tokens=8)
    assert reported_cached_tokens(wire) == 8


def test_missing_null_or_non_numeric_counts_read_as_unknown() -> None:
    wire = {"prompt_tokens": None, "completion_tokens": "3", "prompt_tokens_details": ["not", "an", "object"]}
    assert parse_usage(wire) == Usage()
    assert parse_usage({"total_tokens": 5, "prompt_tokens_details": None}) == Usage(total_tokens=5)
    assert reported_cached_tokens({"prompt_tokens_details": {"cached_tokens": 2.5}}) is None


def test_no_usage_object_is_no_usage() -> None:
    assert parse_usage(None) is None and parse_usage("usage") is None and parse_usage([1]) is None
    assert reported_cached_tokens(None) is None
