"""The Responses stream of an ``auto`` answer that writes text and then calls a tool: a message item,
then a function_call item, each opened and closed in OpenAI's event order, and the final response's
output equal to the whole answer's (``ResponseBuilder.output_items``)."""

import json

from engine.core.llm_engine import RequestOutput
from engine.server.responses_api import ResponseBuilder
from engine.server.responses_stream import ResponseStream
from engine.server.tool_choice import ToolMode
from protocol.openai import ResponsesRequest, validate

PIECES = [
    "Let me",
    " check.",
    "\n<tool",
    '_call>\n{"name": "get_weather", ',
    '"arguments": {"city": "Paris"}}\n</tool_call>',
]
MODE = ToolMode("auto", {"get_weather": {"type": "object"}})


def output(text: str, finished: bool) -> RequestOutput:
    return RequestOutput(text, [1], finished, "stop" if finished else None, 10, 5, 0)


def streamed(mode: ToolMode | None, pieces: list[str]) -> list[dict]:
    request = validate({"input": "Weather in Paris?"}, ResponsesRequest)
    stream = ResponseStream(ResponseBuilder("m", request, mode))
    events = stream.opening()
    for position, piece in enumerate(pieces):
        events += stream.feed(output(piece, position == len(pieces) - 1))
    return events


def test_text_then_a_call_streams_as_two_items() -> None:
    events = streamed(MODE, PIECES)
    kinds = [event["type"] for event in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    message, call = events[-1]["response"]["output"]
    assert message["content"][0]["text"] == "Let me check.\n" and message["id"] == events[2]["item"]["id"]
    assert events[10]["output_index"] == 1 and call["id"] == events[10]["item"]["id"] == events[11]["item_id"]
    assert call["type"] == "function_call" and call["name"] == "get_weather" and call["status"] == "completed"
    assert json.loads(call["arguments"]) == {"city": "Paris"} == json.loads(events[12]["arguments"])
    request = validate({"input": "Weather in Paris?"}, ResponsesRequest)
    whole = ResponseBuilder("m", request, MODE).output_items("".join(PIECES), output("", True))
    assert [(item["type"], item.get("name")) for item in whole] == [("message", None), ("function_call", "get_weather")]
    assert whole[0]["content"][0]["text"] == "Let me check." and whole[1]["arguments"] == call["arguments"]


def test_without_tools_the_message_opens_at_once_and_an_empty_answer_still_has_one() -> None:
    events = streamed(None, [""])
    assert [event["type"] for event in events][2:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == ""
    assert [event["type"] for event in streamed(MODE, ["Hi"])][2:4] == [
        "response.output_item.added",
        "response.content_part.added",
    ]
