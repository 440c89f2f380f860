"""An OpenAI-API front for Dynamo's select_service, so it can route a benchmark like any router.

select_service only chooses: it takes token ids and answers which worker to send them to. This
proxy does the rest, as Dynamo's own frontend would:

1. tokenizes the request exactly as the bundled engine does (``normalize.chat_tokenizer``, the
   chat template included: ``engine/server/openai_checks.py`` renders prompts with the same code);
2. ``POST /select_and_reserve`` with those token ids (the reservation counts the request as
   active prefill load on the chosen worker);
3. forwards the body unchanged to the chosen worker's endpoint and streams the answer back;
4. reports ``/reservations/{id}/prefill_complete`` at the first streamed chunk with a token, and
   ``DELETE /reservations/{id}`` when the request ends (also on error or a client that left).

Run: ``kvgate bench dynamo-proxy --port P --select-url http://127.0.0.1:S --model M``.
"""

import argparse
import contextlib
import uuid
from typing import Any

import orjson
from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

from normalize.chat_tokenizer import ChatTokenizer, TemplateError

BACKEND_HEADER = "x-kvgate-backend"
"""The worker that served the request (the header the load generator reads from every router)."""
SELECT_TIMEOUT_S = 10.0
FORWARD_TIMEOUT_S = 600.0

SESSION: web.AppKey[ClientSession] = web.AppKey("session", ClientSession)
TOKENIZER: web.AppKey[ChatTokenizer] = web.AppKey("tokenizer", ChatTokenizer)
SELECT_URL: web.AppKey[str] = web.AppKey("select_url", str)
MODEL: web.AppKey[str] = web.AppKey("model", str)


class BadRequest(ValueError):
    """The request's content cannot be tokenized: a 400 for the client."""


def prompt_token_ids(path: str, body: dict[str, Any], tokenizer: ChatTokenizer) -> list[int]:
    """The token ids the engine will compute for this request."""
    if path.endswith("/chat/completions"):
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        try:
            return tokenizer.encode_chat(messages, body.get("tools"))
        except TemplateError as exc:
            raise BadRequest(str(exc)) from None
    prompt = body.get("prompt")
    if isinstance(prompt, str) and prompt:
        return tokenizer.encode_text(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(token, int) for token in prompt):
        return prompt
    raise BadRequest("prompt must be one non-empty text or list of token ids")


def error_response(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return web.json_response(body, status=status, dumps=lambda value: orjson.dumps(value).decode())


async def proxy(request: web.Request) -> web.StreamResponse:
    app = request.app
    try:
        body = orjson.loads(await request.read())
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        token_ids = prompt_token_ids(request.path, body, app[TOKENIZER])
    except (orjson.JSONDecodeError, BadRequest) as exc:
        return error_response(400, str(exc), "invalid_request_error")
    session, select_url = app[SESSION], app[SELECT_URL]
    selection_id = uuid.uuid4().hex
    choice = {"selection_id": selection_id, "model_name": app[MODEL], "token_ids": token_ids}
    try:
        async with session.post(
            f"{select_url}/select_and_reserve",
            data=orjson.dumps({**choice, "isl_tokens": len(token_ids)}),
            headers={"Content-Type": "application/json"},
            timeout=ClientTimeout(total=SELECT_TIMEOUT_S),
        ) as selected:
            if selected.status != 200:
                return error_response(503, f"select_service answered {selected.status}", "service_unavailable")
            endpoint = str(orjson.loads(await selected.read())["endpoint"])
    except (TimeoutError, ClientError, KeyError) as exc:
        return error_response(503, f"select_service failed: {exc!r}", "service_unavailable")
    try:
        return await _forward(request, body, endpoint, selection_id)
    finally:
        await _report(session, "DELETE", f"{select_url}/reservations/{selection_id}")


async def _forward(request: web.Request, body: dict[str, Any], endpoint: str, selection_id: str) -> web.StreamResponse:
    session, select_url = request.app[SESSION], request.app[SELECT_URL]
    try:
        upstream_cm = session.post(
            f"{endpoint}{request.path}",
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json"},
            timeout=ClientTimeout(total=FORWARD_TIMEOUT_S),
        )
        async with upstream_cm as upstream:
            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            response.headers[BACKEND_HEADER] = endpoint
            await response.prepare(request)
            prefilled = False
            async for line in upstream.content:
                if not prefilled and has_token(line):
                    prefilled = True
                    await _report(session, "POST", f"{select_url}/reservations/{selection_id}/prefill_complete")
                await response.write(line)
            await response.write_eof()
            return response
    except (TimeoutError, ClientError) as exc:
        return error_response(502, f"worker {endpoint} failed: {exc!r}", "bad_gateway")


def has_token(line: bytes) -> bool:
    """Whether an SSE line carries generated text (the first one ends the request's prefill)."""
    if not line.startswith(b"data:"):
        return False
    payload = line[5:].strip()
    if not payload.startswith(b"{"):
        return False
    try:
        chunk = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return False
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    return any(
        isinstance(choice, dict) and (choice.get("text") or (choice.get("delta") or {}).get("content"))
        for choice in choices or ()
    )


async def _report(session: ClientSession, method: str, url: str) -> None:
    """Tell select_service about a request's progress; a failure there must not fail the request."""
    with contextlib.suppress(TimeoutError, ClientError):
        async with session.request(method, url, timeout=ClientTimeout(total=SELECT_TIMEOUT_S)) as reply:
            await reply.read()


async def health(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def make_app(select_url: str, model: str, tokenizer: ChatTokenizer) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[TOKENIZER], app[SELECT_URL], app[MODEL] = tokenizer, select_url.rstrip("/"), model

    async def session_context(app: web.Application) -> Any:
        app[SESSION] = ClientSession(connector=TCPConnector(limit=0))
        yield
        await app[SESSION].close()

    app.cleanup_ctx.append(session_context)
    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", proxy)
    app.router.add_post("/v1/chat/completions", proxy)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvgate bench dynamo-proxy", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--select-url", required=True, help="Dynamo select_service, e.g. http://127.0.0.1:8092")
    parser.add_argument("--model", required=True, help="model name the workers were registered under")
    parser.add_argument("--tokenizer", default=None, help="bundled model name, GGUF or HF folder (default: --model)")
    args = parser.parse_args(argv)
    tokenizer = ChatTokenizer.load(args.tokenizer or args.model)
    web.run_app(
        make_app(args.select_url, args.model, tokenizer),
        host="127.0.0.1",
        port=args.port,
        print=None,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
