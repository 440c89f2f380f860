"""What Envoy does around the picker in the end-to-end tests: send a request's messages, read the
pick, forward the picked body to the picked engine, relay its answer back (tests/epp/envoy_sequences.py)."""

from typing import Any

import grpc
import orjson
from envoy.service.ext_proc.v3.external_processor_pb2 import HeadersResponse, ProcessingResponse
from google.protobuf.struct_pb2 import Struct

from tests.epp.envoy_sequences import (
    BUFFERED,
    EnvoySide,
    request_body,
    request_headers,
    response_body,
    response_headers,
)
from tests.epp.picker_process import Picker
from tests.procs import http

OPEN_KEY = "key-open"
CAPPED_KEY = "key-capped"
DESTINATION = "x-gateway-destination-endpoint"


def destination_metadata(endpoint: str) -> Struct:
    expected = Struct()
    expected.update({"envoy.lb": {DESTINATION: endpoint}})
    return expected


def set_headers(answer: ProcessingResponse, phase: str) -> dict[str, bytes]:
    common = getattr(answer, phase).response
    return {option.header.key: option.header.raw_value for option in common.header_mutation.set_headers}


def forward(endpoint: str, body: bytes) -> tuple[int, str, bytes]:
    """What Envoy does with the pick: send the (mutated) body to the picked endpoint."""
    reply = http("POST", f"http://{endpoint}/v1/chat/completions", body, {"content-type": "application/json"})
    return reply.status, reply.headers.get("content-type") or reply.headers.get("Content-Type") or "", reply.body


def nothing_held(picker: Picker) -> bool:
    state = picker.admin()
    backends = state["backends"]
    return (
        all(backend["in_flight"] == 0 and backend["kv_reserved_blocks"] == 0 for backend in backends)
        and not any(state["tenants_in_flight"].values())
        and not state["queued"]
    )


async def buffered_pick(
    channel: grpc.aio.Channel, body: dict[str, Any], api_key: str = OPEN_KEY, **headers: Any
) -> tuple[EnvoySide, ProcessingResponse]:
    """Request headers then the whole body (BUFFERED); the answer to the body."""
    raw = orjson.dumps(body)
    envoy = EnvoySide(channel)
    await envoy.send(request_headers(raw, api_key, request_mode=BUFFERED, **headers))
    first = await envoy.answer()
    if first.HasField("immediate_response"):
        return envoy, first
    assert first == ProcessingResponse(request_headers=HeadersResponse())
    await envoy.send(request_body(raw, end_of_stream=True))
    return envoy, await envoy.answer()


def forwarded_body(answer: ProcessingResponse, body: dict[str, Any]) -> bytes:
    """The body Envoy sends on: the picker's replacement, else the client's own."""
    return answer.request_body.response.body_mutation.body or orjson.dumps(body)


async def finish_whole(envoy: EnvoySide, endpoint: str, forwarded: bytes) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Envoy forwards the body to ``endpoint`` (and says so), relays the JSON answer through the
    picker; the completion, and the headers the picker adds to the client's response."""
    status, content_type, answer = forward(endpoint, forwarded)
    assert status == 200, answer
    await envoy.send(response_headers(status, content_type, served=endpoint))
    added = set_headers(await envoy.answer(), "response_headers")
    await envoy.send(response_body(answer, end_of_stream=True))
    assert (await envoy.answer()).HasField("response_body")
    await envoy.close()
    return orjson.loads(answer), added


def endpoints_of(answer: ProcessingResponse, phase: str = "request_body") -> list[str]:
    """The picked endpoints, primary first, after checking the header and the metadata say the same."""
    value = set_headers(answer, phase)[DESTINATION].decode()
    assert answer.dynamic_metadata == destination_metadata(value)
    return value.split(",")
