"""aiohttp's HTTP server with the gateway's answers to broken and slow clients.

aiohttp answers a request it cannot parse (a bad header line, say) itself, before any
middleware runs, in plain text that quotes part of the offending bytes. Here that answer is an
OpenAI-shaped JSON error that quotes nothing. A connection whose request headers do not arrive
whole within ``header_timeout_s`` (config `timeouts.client_headers_s`) of their first byte (or
of the connection, for the first request) is closed: a slow-trickle client cannot hold a connection open at no cost. The body has
its own timeout in the handler.

Both are reported to ``on_refused`` (the gateway records them in its request log and metrics like
any refusal): an unparsable request with its 4xx, a connection closed for headers that started
but never finished as a 408 ``request_header_timeout`` (a connection that sent nothing at all is
not a request and is not reported).
"""

import asyncio
import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from aiohttp import StreamReader, web
from aiohttp.web_protocol import RequestHandler, RequestPayloadError, _ErrInfo
from aiohttp.web_request import BaseRequest

from gateway.errors import OpenAIError, error_response

log = logging.getLogger("kvgate.http")

KEEPALIVE_TIMEOUT_S = 75.0
"""An idle keep-alive connection is closed after this long (aiohttp's default is an hour)."""
LINGERING_S = 10.0
"""After answering a request whose body is still arriving (a 408, 413 or 401 before the body was
read), the rest is read and dropped for up to this long so that the client sees the answer
rather than a reset (aiohttp's default). Never longer than ``timeouts.client_body_s``: a client
that trickled its body past that limit is not given as long again on the same connection."""

OnRefused = Callable[[OpenAIError], None]
"""Told of every request refused before the app saw it."""


def _ignore(error: OpenAIError) -> None:
    return None


class GatewayRequestHandler(RequestHandler):
    """One client connection: header deadline, OpenAI-shaped parser errors."""

    def __init__(
        self, manager: web.Server, *, header_timeout_s: float, on_refused: OnRefused = _ignore, **kwargs: Any
    ) -> None:
        super().__init__(manager, **kwargs)
        self.header_timeout_s = header_timeout_s
        self.on_refused = on_refused
        self._header_deadline: asyncio.TimerHandle | None = None
        self._partial_head = False
        """Bytes of a request head arrived and the head is not whole yet."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        body = self._body_being_received()
        queued = len(self._messages)
        super().data_received(data)
        if body is not None and len(self._messages) > queued:
            error = self._messages[-1][0]
            if isinstance(error, _ErrInfo):
                self._messages.pop()
                self._fail_body(body, error)
        if self._messages or self._current_request is not None:
            self._partial_head = False
            self._disarm_header_deadline()
        else:
            self._partial_head = bool(data)
            if self._header_deadline is None:
                self._arm_header_deadline()

    def _body_being_received(self) -> StreamReader | None:
        """The unfinished body of the last request whose head was parsed (queued, or being handled)."""
        if self._messages:
            message, payload = self._messages[-1]
            body = None if isinstance(message, _ErrInfo) else payload
        else:
            body = self._current_request.content if self._current_request is not None else None
        return body if body is not None and not body.is_eof() else None

    def _fail_body(self, body: StreamReader, error: _ErrInfo) -> None:
        """The parser failed on a body that arrived after its head (the end of a deflate stream that
        does not decompress, say). aiohttp's C parser reports that as an error message of its own and
        leaves the request waiting for a body that has already come: a 408 after
        ``timeouts.client_body_s``, then a second answer for the error message. Here the request's body
        read fails at once instead (the handler's 400, its only answer), and the connection closes after
        the request being handled (the parser cannot go on; a failed body of a pipelined request, queued
        behind the one being handled, goes unanswered)."""
        log.info("refused a request body the HTTP parser failed on: %s", type(error.exc).__name__)
        body.set_exception(RequestPayloadError(error.message))
        body.feed_eof()
        self.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        self._header_deadline = asyncio.get_running_loop().call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if not self._messages and self._current_request is None:
            log.info("closing a connection whose request headers took over %.0f s", self.header_timeout_s)
            if self._partial_head:
                message = f"The request headers did not arrive within {self.header_timeout_s:g} s."
                self.on_refused(OpenAIError(408, message, code="request_header_timeout"))
            self.force_close()

    def handle_error(
        self, request: BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("Response is sent already, cannot send another response with the error message")
        log.info("refused an unparsable request from %s: %s", request.remote, type(exc).__name__ if exc else status)
        if status >= 500:
            error = OpenAIError(status, "internal gateway error", type_="server_error", code="internal_error")
        else:
            phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Bad Request"
            error = OpenAIError(
                status, f"The HTTP request could not be parsed ({phrase}).", code="invalid_http_request"
            )
        self.on_refused(error)
        response = error_response(error)
        response.force_close()
        return response


class GatewayServer(web.Server):
    def __init__(self, *args: Any, header_timeout_s: float, on_refused: OnRefused = _ignore, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self.on_refused = on_refused

    def __call__(self) -> RequestHandler:
        return GatewayRequestHandler(
            self, header_timeout_s=self.header_timeout_s, on_refused=self.on_refused, loop=self._loop, **self._kwargs
        )


class GatewayRunner(web.AppRunner):
    """``web.AppRunner`` whose connections are ``GatewayRequestHandler``s."""

    def __init__(
        self, app: web.Application, header_timeout_s: float, on_refused: OnRefused = _ignore, **kwargs: Any
    ) -> None:
        kwargs.setdefault("keepalive_timeout", KEEPALIVE_TIMEOUT_S)
        super().__init__(app, **kwargs)
        self.header_timeout_s = header_timeout_s
        self.on_refused = on_refused

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return GatewayServer(
            server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            loop=server._loop,
            header_timeout_s=self.header_timeout_s,
            on_refused=self.on_refused,
            **server._kwargs,
        )
