"""The pieces of Messages passthrough that need no process: usage, the stream reader, stop bounds."""

import orjson
import pytest

from gateway.anthropic.native_stream import NativeStreamReader, native_usage
from gateway.anthropic.request import check_stop_sequences
from gateway.errors import OpenAIError
from protocol.anthropic import chat_usage_of_anthropic


def sse(payload: dict) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def events_of(data: bytes) -> list[dict]:
    return [orjson.loads(line.removeprefix(b"data: ")) for line in data.splitlines() if line.startswith(b"data: ")]


def test_anthropic_usage_in_chat_terms_counts_cache_reads_and_writes_into_the_prompt() -> None:
    usage = {"input_tokens": 10, "cache_read_input_tokens": 32, "cache_creation_input_tokens": 16, "output_tokens": 5}
    assert chat_usage_of_anthropic(usage) == {
        "prompt_tokens": 58,
        "completion_tokens": 5,
        "total_tokens": 63,
        "prompt_tokens_details": {"cached_tokens": 32},
    }
    assert chat_usage_of_anthropic({"input_tokens": 7, "output_tokens": 2, "cache_read_input_tokens": None})[
        "prompt_tokens_details"
    ] == {"cached_tokens": 0}
    assert native_usage(b'{"type": "message"}') is None and native_usage(b"not json") is None


def test_the_reader_reports_final_usage_only_once_message_delta_came() -> None:
    reader = NativeStreamReader()
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 9, "cache_read_input_tokens": 3}}}
    assert reader.read(sse(start)) == "message_start" and reader.final_usage is None
    assert reader.read(sse({"type": "content_block_start", "index": 2, "content_block": {}})) == "content_block_start"
    assert reader.read(b": keep-alive comment\n\n") is None
    assert reader.read(sse({"type": "message_delta", "usage": {"output_tokens": 4}})) == "message_delta"
    assert reader.final_usage is not None and reader.final_usage["total_tokens"] == 16


def test_closing_events_close_the_open_block_then_the_message_with_max_tokens() -> None:
    reader = NativeStreamReader()
    reader.read(sse({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}))
    closing = events_of(reader.closing_events(7))
    assert [event["type"] for event in closing] == ["content_block_stop", "message_delta", "message_stop"]
    assert closing[0]["index"] == 1 and closing[1]["delta"]["stop_reason"] == "max_tokens"
    assert closing[1]["usage"] == {"output_tokens": 7}
    reader.read(sse({"type": "content_block_stop", "index": 1}))
    assert [event["type"] for event in events_of(reader.closing_events(7))] == ["message_delta", "message_stop"]


@pytest.mark.parametrize("stops", [["a", "b", "c", "d", "e"], ["x" * 1001]])
def test_stop_sequences_over_the_bound_are_refused_naming_stop_sequences(stops: list[str]) -> None:
    with pytest.raises(OpenAIError) as caught:
        check_stop_sequences(stops)
    assert caught.value.status == 400 and caught.value.param == "stop_sequences"
    assert "'stop'" not in caught.value.message
    check_stop_sequences(["a", "b", "c", "d"])
    check_stop_sequences(None)
