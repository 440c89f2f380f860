"""A backend's error body that is not OpenAI-shaped reaches the client as an OpenAI error.

vLLM answers an endpoint it does not serve for its model with FastAPI's ``{"detail": "Not Found"}``
(seen against vLLM 0.32: /v1/embeddings on a generating replica); aiohttp servers with plain text.
"""

import orjson

from gateway.backends.upstream_error import openai_error_body
from tests.gateway.fake_replica import MODEL, FakeReplica, gateway, gateway_config, replicas


def error_of(body: bytes) -> dict[str, object]:
    parsed = orjson.loads(body)
    assert set(parsed) == {"error"} and set(parsed["error"]) == {"message", "type", "param", "code"}
    return parsed["error"]


def test_fastapi_not_found_becomes_an_openai_404_naming_model_and_endpoint() -> None:
    error = error_of(openai_error_body(404, b'{"detail":"Not Found"}', "/v1/embeddings", "smollm2-135m"))
    assert error["type"] == "invalid_request_error" and error["param"] == "model"
    assert error["message"] == (
        "the backend serving model 'smollm2-135m' answered 404 to /v1/embeddings: Not Found"
        " (it does not serve /v1/embeddings for this model)"
    )


def test_plain_text_validation_lists_and_empty_bodies_are_quoted() -> None:
    assert "answered 400 to /v1/completions: bad prompt" in str(
        error_of(openai_error_body(400, b"bad prompt\n", "/v1/completions", "m"))["message"]
    )
    validation = b'{"detail":[{"loc":["body","n"],"msg":"too large"}]}'
    assert '"msg":"too large"' in str(error_of(openai_error_body(422, validation, "/v1/completions", "m"))["message"])
    assert str(error_of(openai_error_body(415, b"", "/v1/completions", "m"))["message"]).endswith(
        "Unsupported Media Type"
    )


def test_openai_shaped_errors_pass_through_unchanged() -> None:
    vllm_error = (
        b'{"error":{"message":"The model `x` does not exist.","type":"NotFoundError","param":"model","code":404}}'
    )
    assert openai_error_body(404, vllm_error, "/v1/chat/completions", "x") == vllm_error


async def test_an_endpoint_the_replica_lacks_is_an_openai_404_through_the_gateway() -> None:
    async with (
        replicas(FakeReplica()) as urls,
        gateway(gateway_config(urls), None) as client,
        client.post("/v1/embeddings", json={"model": MODEL, "input": "a red fox"}) as reply,
    ):
        status, content_type, body = reply.status, reply.content_type, await reply.read()
    assert status == 404 and content_type == "application/json"
    error = error_of(body)
    assert error["param"] == "model" and "answered 404 to /v1/embeddings: 404: Not Found" in str(error["message"])
