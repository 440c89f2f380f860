"""The ext_proc messages Envoy sends for one HTTP request, built as Envoy builds them, and a client
that plays Envoy's side of the stream.

Sources (envoyproxy/envoy): api/envoy/service/ext_proc/v3/external_processor.proto (messages),
api/envoy/extensions/filters/http/ext_proc/v3/processing_mode.proto (BUFFERED: one body message
with ``end_of_stream``; FULL_DUPLEX_STREAMED: body chunks sent without waiting for answers, the
last with ``end_of_stream``), source/extensions/filters/http/ext_proc/ext_proc.cc (header values
in ``raw_value``, ``protocol_config`` on the first message of a stream) and
test/extensions/filters/http/ext_proc/ext_proc_integration_test.cc and
ext_proc_full_duplex_integration_test.cc (the request-headers, request-body, response-headers,
response-body orders these tests drive; ``Filter::encodeProtocolConfig`` in ext_proc.cc sets
``protocol_config`` once, on a stream's first message). The served endpoint
comes in ``metadata_context`` under ``envoy.lb`` (GIE's docs/proposals/004-endpoint-picker-protocol).
"""

from typing import Any

import grpc
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue, Metadata
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    HttpBody,
    HttpHeaders,
    ProcessingRequest,
    ProcessingResponse,
    ProtocolConfiguration,
)
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorStub
from google.protobuf.struct_pb2 import Struct

BUFFERED = ProcessingMode.BUFFERED
STREAMED = ProcessingMode.STREAMED
FULL_DUPLEX = ProcessingMode.FULL_DUPLEX_STREAMED


def header_map(headers: dict[str, str]) -> HeaderMap:
    return HeaderMap(headers=[HeaderValue(key=key, raw_value=value.encode()) for key, value in headers.items()])


def request_headers(
    body: bytes,
    api_key: str,
    *,
    request_mode: int = BUFFERED,
    response_mode: int = STREAMED,
    subset: list[str] | None = None,
    request_id: str | None = None,
    path: str = "/v1/chat/completions",
) -> ProcessingRequest:
    headers = {
        ":authority": "gateway.example",
        ":path": path,
        ":method": "POST",
        ":scheme": "http",
        "content-type": "application/json",
        "content-length": str(len(body)),
        "authorization": f"Bearer {api_key}",
    }
    if request_id is not None:
        headers["x-request-id"] = request_id
    message = ProcessingRequest(
        request_headers=HttpHeaders(headers=header_map(headers), end_of_stream=not body),
        protocol_config=ProtocolConfiguration(request_body_mode=request_mode, response_body_mode=response_mode),  # type: ignore[arg-type]
    )
    if subset is not None:
        hint = Struct()
        hint.update({"x-gateway-destination-endpoint-subset": subset})
        message.metadata_context.CopyFrom(Metadata(filter_metadata={"envoy.lb.subset_hint": hint}))
    return message


def request_body(chunk: bytes, end_of_stream: bool) -> ProcessingRequest:
    return ProcessingRequest(request_body=HttpBody(body=chunk, end_of_stream=end_of_stream))


def response_headers(status: int, content_type: str, served: str | None) -> ProcessingRequest:
    headers = header_map({":status": str(status), "content-type": content_type})
    message = ProcessingRequest(response_headers=HttpHeaders(headers=headers))
    if served is not None:
        lb = Struct()
        lb.update({"x-gateway-destination-endpoint-served": served})
        message.metadata_context.CopyFrom(Metadata(filter_metadata={"envoy.lb": lb}))
    return message


def response_body(chunk: bytes, end_of_stream: bool) -> ProcessingRequest:
    return ProcessingRequest(response_body=HttpBody(body=chunk, end_of_stream=end_of_stream))


class EnvoySide:
    """One ext_proc stream as Envoy holds it: write a message, read the picker's answers."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.call: Any = ExternalProcessorStub(channel).Process()

    async def send(self, message: ProcessingRequest) -> None:
        await self.call.write(message)

    async def answer(self) -> ProcessingResponse:
        answer = await self.call.read()
        assert answer is not grpc.aio.EOF, "the picker ended the stream"
        return answer

    async def close(self) -> None:
        await self.call.done_writing()

    def cancel(self) -> None:
        self.call.cancel()
