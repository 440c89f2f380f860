"""The response phase's reader: usage and progress from answers Envoy relays in arbitrary chunks."""

import orjson

from gateway.epp.usage_reader import UsageReader


def sse(*events: dict) -> bytes:
    return b"".join(b"data: " + orjson.dumps(event) + b"\n\n" for event in events) + b"data: [DONE]\n\n"


def read(data: bytes, content_type: str, chunk: int) -> UsageReader:
    reader = UsageReader()
    reader.on_headers(200, content_type)
    pieces = [data[index : index + chunk] for index in range(0, len(data), chunk)] or [b""]
    for index, piece in enumerate(pieces):
        reader.on_chunk(piece, end_of_stream=index == len(pieces) - 1)
    return reader


def test_a_stream_split_anywhere_gives_the_same_usage_and_token_count() -> None:
    usage = {
        "prompt_tokens": 40,
        "completion_tokens": 2,
        "total_tokens": 42,
        "prompt_tokens_details": {"cached_tokens": 32},
    }
    data = sse(
        {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        {"choices": [{"index": 0, "delta": {"content": "Hi"}}]},
        {"choices": [{"index": 0, "delta": {"content": "!"}}]},
        {"choices": [], "usage": usage},
    )
    for chunk in (1, 7, 64, len(data)):
        outcome = read(data, "text/event-stream; charset=utf-8", chunk).outcome
        assert outcome.completed and outcome.token_chunks == 2
        assert outcome.usage is not None and outcome.usage.cached_tokens == 32 and outcome.usage.total_tokens == 42


def test_a_stream_cut_before_done_is_not_completed() -> None:
    data = sse({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}).removesuffix(b"data: [DONE]\n\n")
    outcome = read(data, "text/event-stream", 5).outcome
    assert not outcome.completed and outcome.token_chunks == 1 and outcome.usage is None


def test_a_whole_answer_and_a_responses_stream() -> None:
    whole = orjson.dumps({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}})
    outcome = read(whole, "application/json", 4).outcome
    assert outcome.completed and outcome.usage is not None and outcome.usage.total_tokens == 10
    usage = {"input_tokens": 20, "output_tokens": 3, "total_tokens": 23, "input_tokens_details": {"cached_tokens": 16}}
    data = sse({"type": "response.completed", "response": {"usage": usage}})
    outcome = read(data, "text/event-stream", 11).outcome
    assert outcome.completed and outcome.usage is not None and outcome.usage.cached_tokens == 16


def test_an_error_answer_is_read_but_not_completed() -> None:
    reader = UsageReader()
    reader.on_headers(503, "application/json")
    reader.on_chunk(orjson.dumps({"error": {"message": "busy", "type": "server_error", "code": "overloaded"}}), True)
    assert not reader.outcome.completed and reader.outcome.error_code == "overloaded"
