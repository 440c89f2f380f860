"""The ext_proc gRPC service: one ``Process`` call per HTTP request Envoy sends through the picker."""

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorServicer

from gateway.epp.stream import ExtProcStream
from gateway.errors import OpenAIError
from gateway.routing_core import RoutingCore

log = logging.getLogger("kvgate.epp")

INTERNAL_ERROR = OpenAIError(500, "internal endpoint picker error", type_="server_error", code="internal_error")
"""What Envoy's client gets for a fault of the picker's own (logged here), as the HTTP gateway answers one."""


class EndpointPicker(ExternalProcessorServicer):
    def __init__(self, core: RoutingCore, fallbacks: int) -> None:
        self.core = core
        self.fallbacks = fallbacks

    async def Process(self, request_iterator: AsyncIterator[ProcessingRequest], context: Any) -> None:  # noqa: N802
        """Answer each message in order; settle the pick when the stream ends however it ends.

        Envoy cancelling the stream (its client left, a timeout) cancels this coroutine: the pick
        is settled then too, shielded so that a second cancellation cannot cut it short."""
        stream = ExtProcStream(self.core, self.fallbacks)
        try:
            async for message in request_iterator:
                try:
                    answers = await stream.on_message(message)
                except Exception:
                    log.exception("ext_proc stream failed on a %s message", message.WhichOneof("request"))
                    answers = stream.refuse(INTERNAL_ERROR)
                for answer in answers:
                    await context.write(answer)
                if stream.done:
                    break
        finally:
            await asyncio.shield(stream.close())
