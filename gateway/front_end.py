"""What a protocol front end gives the request path (gateway/handler.py) besides OpenAI's own.

A front end turns its protocol's body into the OpenAI request the core routes, and the core's
answer back into its protocol: errors, whole answers and streams. The core never sees its types.
"""

from typing import Any, Protocol

from aiohttp import web

from gateway.dispatch import NativeForm
from gateway.errors import OpenAIError
from gateway.openai_request import ParsedRequest
from gateway.served_model import ServedModel


class FrontEnd(Protocol):
    """One request's translation (a front end object serves one request and may keep its state)."""

    def parse(self, body: object) -> ParsedRequest:
        """The client's body as the OpenAI request to route; raises OpenAIError (400) when bad."""
        ...

    async def prompt_known(
        self, model: ServedModel, body: dict[str, Any], salt: str | None, prompt_ids: list[int]
    ) -> None:
        """Called once the prompt is tokenized (``body``: the normalized OpenAI body)."""
        ...

    def stream_response(self, *, status: int, headers: dict[str, str]) -> web.StreamResponse:
        """The response the proxy streams the backend's chunks into."""
        ...

    def native_form(self, forwarded: dict[str, Any]) -> NativeForm | None:
        """The request in the client's protocol for replicas that serve it themselves, given the
        translated body the others get (``forwarded``: its model, granted cap and cache salt)."""
        ...

    def finish(self, response: web.StreamResponse) -> web.StreamResponse:
        """The client's response for the proxy's: a whole answer or backend error translated; a
        stream (already sent) as it is."""
        ...

    def error_response(self, error: OpenAIError, extra_headers: dict[str, str]) -> web.Response:
        """A refusal in the front end's error shape."""
        ...
