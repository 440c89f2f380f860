"""The ext_proc answers the picker sends Envoy (envoy/service/ext_proc/v3/external_processor.proto).

The pick's shape follows GIE's reference EPP (kubernetes-sigs/gateway-api-inference-extension,
pkg/epp/handlers/server.go, ``populateRequestHeaderResponse``): the endpoint in one header and the
same value under ``dynamic_metadata["envoy.lb"]``, ``clear_route_cache`` so Envoy routes again on
the new header, and ``Content-Length`` set whenever the body is replaced.
"""

import orjson
from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    BodyMutation,
    BodyResponse,
    CommonResponse,
    HeaderMutation,
    HeadersResponse,
    ImmediateResponse,
    ProcessingResponse,
    StreamedBodyResponse,
)
from envoy.type.v3.http_status_pb2 import HttpStatus
from google.protobuf.struct_pb2 import Struct

from gateway.errors import OpenAIError

DESTINATION_HEADER = "x-gateway-destination-endpoint"
"""Where the pick goes, as a header and as the key inside the ``envoy.lb`` metadata namespace."""
DESTINATION_NAMESPACE = "envoy.lb"


CLIENT_KEY_HEADERS = ("authorization", "x-api-key")
"""The tenant's API key stays at the gateway, as the HTTP gateway never forwards it: removed from the
request unless the picked replica's own credentials replace it."""


def header_mutation(headers: dict[str, str], remove: list[str] | None = None) -> HeaderMutation:
    return HeaderMutation(
        set_headers=[
            HeaderValueOption(header=HeaderValue(key=key, raw_value=value.encode())) for key, value in headers.items()
        ],
        remove_headers=remove or [],
    )


def destination_metadata(endpoints: str) -> Struct:
    """``{"envoy.lb": {"x-gateway-destination-endpoint": endpoints}}``."""
    metadata = Struct()
    metadata.update({DESTINATION_NAMESPACE: {DESTINATION_HEADER: endpoints}})
    return metadata


def pick_mutation(endpoints: str, body_length: int | None, replica_headers: dict[str, str]) -> HeaderMutation:
    """The request headers the pick sets: the destination, the new length of a replaced body, and the
    picked replica's own headers (``backends[].headers``, its API key, as the gateway sends them);
    the client's API key headers are removed unless those replace them."""
    headers = {DESTINATION_HEADER: endpoints}
    if body_length is not None:
        headers["content-length"] = str(body_length)
    headers.update((key.lower(), value) for key, value in replica_headers.items())
    return header_mutation(headers, [name for name in CLIENT_KEY_HEADERS if name not in headers])


def headers_pick(endpoints: str, mutation: HeaderMutation) -> ProcessingResponse:
    """The pick as the answer to the request headers (full-duplex streaming: sent once the body is read)."""
    common = CommonResponse(header_mutation=mutation, clear_route_cache=True)
    return ProcessingResponse(
        request_headers=HeadersResponse(response=common), dynamic_metadata=destination_metadata(endpoints)
    )


def body_pick(endpoints: str, mutation: HeaderMutation, body: bytes | None) -> ProcessingResponse:
    """The pick as the answer to a buffered request body: Envoy still holds the headers, so they can change here."""
    common = CommonResponse(header_mutation=mutation, clear_route_cache=True)
    if body is not None:
        common.body_mutation.CopyFrom(BodyMutation(body=body))
    return ProcessingResponse(
        request_body=BodyResponse(response=common), dynamic_metadata=destination_metadata(endpoints)
    )


def streamed_request_body(body: bytes) -> ProcessingResponse:
    """The request body (original or normalized) handed back whole in full-duplex streaming mode."""
    mutation = BodyMutation(streamed_response=StreamedBodyResponse(body=body, end_of_stream=True))
    return ProcessingResponse(request_body=BodyResponse(response=CommonResponse(body_mutation=mutation)))


def streamed_response_body(body: bytes, end_of_stream: bool) -> ProcessingResponse:
    """A response body chunk passed through unchanged in full-duplex streaming mode."""
    mutation = BodyMutation(streamed_response=StreamedBodyResponse(body=body, end_of_stream=end_of_stream))
    return ProcessingResponse(response_body=BodyResponse(response=CommonResponse(body_mutation=mutation)))


def continue_request_headers() -> ProcessingResponse:
    return ProcessingResponse(request_headers=HeadersResponse())


def continue_request_body() -> ProcessingResponse:
    return ProcessingResponse(request_body=BodyResponse())


def continue_response_headers() -> ProcessingResponse:
    return ProcessingResponse(response_headers=HeadersResponse())


def continue_response_body() -> ProcessingResponse:
    return ProcessingResponse(response_body=BodyResponse())


def continue_trailers(response: bool) -> ProcessingResponse:
    message = ProcessingResponse()
    (message.response_trailers if response else message.request_trailers).SetInParent()
    return message


def immediate_error(error: OpenAIError, request_id: str) -> ProcessingResponse:
    """The refusal as Envoy sends it to the client: the gateway's status, headers and OpenAI-shaped JSON body."""
    headers = {"content-type": "application/json", **{key.lower(): value for key, value in error.headers.items()}}
    headers["x-request-id"] = request_id
    answer = ImmediateResponse(
        status=HttpStatus(code=error.status),
        headers=header_mutation(headers),
        body=orjson.dumps(error.body()),
        details=f"kvgate_epp_{error.code or error.type}",
    )
    return ProcessingResponse(immediate_response=answer)
