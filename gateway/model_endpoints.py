"""``GET /v1/models/{id}``: one model object, as in ``/v1/models`` (``openai.models.retrieve``)."""

import orjson
from aiohttp import web

from gateway.errors import OpenAIError, error_response, model_not_found
from gateway.handler import client_request_id
from gateway.wiring.state import GATEWAY, Gateway


async def retrieve_model(request: web.Request) -> web.Response:
    """The served model, adapter or alias named ``id``; an unknown id is a 404 in OpenAI's shape."""
    gateway: Gateway = request.app[GATEWAY]
    request_id = client_request_id(request)
    model_id = request.match_info["model_id"]
    try:
        gateway.tenants.authenticate(request)
        listing = gateway.models.listing(gateway.pool.reported_adapters(), gateway.pool.context_length)
        found = next((entry for entry in listing if entry["id"] == model_id), None)
        if found is None:
            raise model_not_found(model_id)
    except OpenAIError as error:
        return error_response(error, {"x-request-id": request_id})
    return web.Response(body=orjson.dumps(found), content_type="application/json", headers={"x-request-id": request_id})
