"""One ext_proc stream (one HTTP request through Envoy), message by message.

The order of messages is Envoy's (envoyproxy/envoy: api/envoy/service/ext_proc/v3/external_processor.proto,
api/envoy/extensions/filters/http/ext_proc/v3/processing_mode.proto, and the sequences its
test/extensions/filters/http/ext_proc/ext_proc_integration_test.cc and
ext_proc_full_duplex_integration_test.cc drive):

- BUFFERED request body: ``request_headers`` (answered at once, CONTINUE), then one ``request_body``
  with ``end_of_stream``, answered with the pick: header mutation + dynamic metadata (+ the new body).
- FULL_DUPLEX_STREAMED request body (what llm-d and GIE's EPP use): ``request_headers``, then body
  chunks sent without waiting; once the chunk with ``end_of_stream`` is in, the headers answer
  carries the pick and the body goes back whole as one ``streamed_response`` (GIE's
  pkg/epp/handlers/server.go answers in this order: headers, then body).
- The response: ``response_headers`` (status, content type, and the served endpoint in
  ``metadata_context``), then body chunks (BUFFERED: one; STREAMED: each answered CONTINUE;
  FULL_DUPLEX_STREAMED: each handed back as it came), which the usage reader reads as they pass.

Envoy says which body modes it uses in ``protocol_config`` of the first message; without it the
picker assumes the request body is BUFFERED and the response body STREAMED. A request body mode
that lets the headers go upstream before the body is read (NONE, STREAMED) cannot be routed on
the prompt: the picker answers such a stream with a 500 naming the setting. A refusal is an
ImmediateResponse and ends the stream. ``close`` settles the pick however the stream ends: the
answer's end, or Envoy cancelling or closing the stream midway.
"""

from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest, ProcessingResponse
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.epp import wire
from gateway.epp.envoy_messages import header_map, served_endpoint, subset_hint
from gateway.epp.pick import Pick, client_request_id, pick
from gateway.epp.usage_reader import UsageReader
from gateway.errors import OpenAIError
from gateway.routing_core import RoutingCore

FULL_DUPLEX = ProcessingMode.FULL_DUPLEX_STREAMED
PICKING_MODES = (ProcessingMode.BUFFERED, ProcessingMode.BUFFERED_PARTIAL, FULL_DUPLEX)
"""Request body modes in which Envoy holds the request until the picker has answered on its body."""
MAX_BODY_BYTES = 8 << 20
"""The largest request body the picker reads, as the HTTP gateway's ``client_max_size`` (gateway/wiring/app.py)."""


class ExtProcStream:
    def __init__(self, core: RoutingCore, fallbacks: int) -> None:
        self.core = core
        self.fallbacks = fallbacks
        self.request_mode = ProcessingMode.BUFFERED
        self.response_mode = ProcessingMode.STREAMED
        self.headers: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())
        self.subset: frozenset[str] | None = None
        self.chunks: list[bytes] = []
        self.body_bytes = 0
        self.pick: Pick | None = None
        self.usage = UsageReader()
        self.done = False
        """An ImmediateResponse was sent: the stream is over for Envoy."""

    async def on_message(self, message: ProcessingRequest) -> list[ProcessingResponse]:
        """The answers to one message from Envoy (none while a full-duplex body is still arriving)."""
        kind = message.WhichOneof("request")
        if kind == "request_headers":
            return await self._on_request_headers(message)
        if kind == "request_body":
            return await self._on_request_body(message.request_body.body, message.request_body.end_of_stream)
        if kind == "response_headers":
            return await self._on_response_headers(message)
        if kind == "response_body":
            return await self._on_response_body(message.response_body.body, message.response_body.end_of_stream)
        if kind in ("request_trailers", "response_trailers"):
            return [wire.continue_trailers(response=kind == "response_trailers")]
        return []

    async def _on_request_headers(self, message: ProcessingRequest) -> list[ProcessingResponse]:
        if message.HasField("protocol_config"):
            self.request_mode = message.protocol_config.request_body_mode
            self.response_mode = message.protocol_config.response_body_mode
        self.headers = header_map(message.request_headers)
        self.subset = subset_hint(message, self.headers)
        if self.request_mode not in PICKING_MODES:
            return self.refuse(_unsupported_mode(self.request_mode))
        if message.request_headers.end_of_stream:
            return await self._pick(b"", in_headers=True)
        if self.request_mode == FULL_DUPLEX:
            return []
        return [wire.continue_request_headers()]

    async def _on_request_body(self, data: bytes, end_of_stream: bool) -> list[ProcessingResponse]:
        self.body_bytes += len(data)
        if self.body_bytes > MAX_BODY_BYTES:
            too_large = OpenAIError(413, "The request body is too large.", code="request_too_large")
            return self.refuse(too_large, client_request_id(self.headers))
        self.chunks.append(data)
        if not end_of_stream:
            return [] if self.request_mode == FULL_DUPLEX else [wire.continue_request_body()]
        raw = b"".join(self.chunks)
        self.chunks = []
        return await self._pick(raw, in_headers=False)

    async def _pick(self, raw: bytes, in_headers: bool) -> list[ProcessingResponse]:
        """The pick, answering the headers (a request without a body, or full-duplex) or the whole body."""
        request_id = client_request_id(self.headers)
        try:
            chosen = self.pick = await pick(self.core, self.headers, raw, self.subset, self.fallbacks, request_id)
        except OpenAIError as error:
            return self.refuse(error, request_id)
        length = len(chosen.body) if chosen.body is not None else None
        upstream_headers = {**chosen.placement.backend.spec.upstream_headers(), **chosen.flight.load_mark_header()}
        headers = wire.pick_mutation(chosen.endpoints, length, upstream_headers)
        chosen.sent()
        if in_headers:
            return [wire.headers_pick(chosen.endpoints, headers)]
        if self.request_mode == FULL_DUPLEX:
            return [
                wire.headers_pick(chosen.endpoints, headers),
                wire.streamed_request_body(chosen.body if chosen.body is not None else raw),
            ]
        return [wire.body_pick(chosen.endpoints, headers, chosen.body)]

    async def _on_response_headers(self, message: ProcessingRequest) -> list[ProcessingResponse]:
        headers = header_map(message.response_headers)
        self.usage.on_headers(_status(headers.get(":status")), headers.get("content-type", ""))
        served = served_endpoint(message)
        if self.pick is not None and served is not None:
            self.pick.served_by(served)
        if message.response_headers.end_of_stream:
            self.usage.on_chunk(b"", end_of_stream=True)
            await self.close()
        answer = wire.continue_response_headers()
        if self.pick is not None:
            answer.response_headers.response.header_mutation.CopyFrom(wire.header_mutation(self.pick.response_headers))
        return [answer]

    async def _on_response_body(self, data: bytes, end_of_stream: bool) -> list[ProcessingResponse]:
        self.usage.on_chunk(data, end_of_stream)
        if end_of_stream:
            await self.close()
        if self.response_mode == FULL_DUPLEX:
            return [wire.streamed_response_body(data, end_of_stream)]
        return [wire.continue_response_body()]

    def refuse(self, error: OpenAIError, request_id: str | None = None) -> list[ProcessingResponse]:
        """End the stream with ``error`` as the client's answer."""
        self.done = True
        given = request_id or (self.pick.req.request_id if self.pick else client_request_id(self.headers))
        return [wire.immediate_error(error, given)]

    async def close(self) -> None:
        """Settle the pick (once): with the answer as read, or as abandoned when it never ended."""
        if self.pick is None:
            return
        outcome = self.usage.outcome
        if not (outcome.completed or outcome.status not in (0, 200)):
            outcome.client_gone = True
        await self.pick.settle(outcome)


def _unsupported_mode(mode: int) -> OpenAIError:
    """The data plane sends the body too late (STREAMED: the headers are already upstream) or not at all."""
    name = ProcessingMode.BodySendMode.Name(mode) if mode in ProcessingMode.BodySendMode.values() else str(mode)
    return OpenAIError(
        500,
        f"The gateway's ext_proc filter sends request bodies in {name} mode; the endpoint picker needs "
        "BUFFERED or FULL_DUPLEX_STREAMED (processing_mode.request_body_mode) to route on the prompt.",
        type_="server_error",
        code="epp_body_mode",
    )


def _status(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0
