"""The engine's OpenAI-compatible HTTP API (aiohttp).

Handlers validate and tokenize, then stream from ``LLMEngine.generate``. With
``handler_cancellation`` on, a client that disconnects cancels its handler, which closes the
output stream and so aborts the request in the engine.
"""

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from engine.core.kv_transfer_types import RemoteKV
from engine.core.llm_engine import EngineError, LLMEngine, RequestOutput
from engine.core.session_hint import SessionHint, session_hint
from engine.model.grammar import Grammar, GrammarCompiler
from engine.model.lora_modules import LoRAModule, LoRARef, lora_refs
from engine.model.runner_api import SamplingParams
from engine.server.embeddings import embeddings_response
from engine.server.kv_connector import KvgateConnector
from engine.server.kv_transfer_params import FIELD as KV_TRANSFER_FIELD
from engine.server.kv_transfer_params import NO_TRANSFER, TransferRequest, transfer_request
from engine.server.load_publisher import LoadPublisher
from engine.server.logprobs_echo import PromptEcho, check_scored_request, prompt_text, refuse_chat_scoring, scored_top
from engine.server.openai_checks import (
    chat_prompt_ids,
    check_model,
    completion_prompt_ids,
    embedding_inputs,
    parse_json,
    parse_request,
    responses_prompt_ids,
    sampling_params,
)
from engine.server.openai_responses import Choice, ResponseShape
from engine.server.responses_api import ResponseBuilder
from engine.server.responses_stream import ResponseStream
from engine.server.responses_tools import responses_grammar, responses_tool_mode
from engine.server.structured_output import constraint_fields, requested_grammar
from engine.server.tool_choice import ToolMode, tool_grammar, tool_mode
from engine.server.tracing import record_spans
from normalize.chat_tokenizer import ChatTokenizer
from normalize.tokenizer_api import detokenize_body, tokenize_body, tokenize_text, tokenizer_info
from protocol.load_mark import LOAD_MARK_HEADER, LoadMark, parse_load_mark
from protocol.openai import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, ResponsesRequest
from protocol.openai_errors import OpenAIError, bad_request, error_body
from protocol.replica_stats import encode_stats
from protocol.startup_heap import freeze_startup_objects
from protocol.tokenize_api import parse_detokenize, parse_tokenize
from protocol.tracing import remote_parent

log = logging.getLogger(__name__)

_MAX_BODY_BYTES = 32 * 1024 * 1024
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_LOAD_MARK = web.RequestKey[LoadMark | None]("kvgate_load_mark")
"""The request's parsed ``x-kvgate-load-mark``, kept on the request by ``_load_mark_on_end``."""


def json_response(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves as an OpenAI error object, never as HTML or a stack trace."""
    try:
        return await handler(request)
    except OpenAIError as exc:
        return json_response(exc.body(), exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error_type = "not_found_error" if exc.status == 404 else "invalid_request_error"
        return json_response(error_body(f"{request.method} {request.path}: {exc.reason}", error_type), exc.status)
    except EngineError as exc:
        return json_response(error_body(str(exc), "internal_error"), 500)
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return json_response(error_body("internal server error", "internal_error"), 500)


class EngineServer:
    def __init__(
        self,
        engine: LLMEngine,
        tokenizer: ChatTokenizer,
        served_model_name: str,
        max_model_len: int,
        load_publisher: LoadPublisher | None = None,
        model_root: str | None = None,
        lora_modules: tuple[LoRAModule, ...] = (),
        connector: KvgateConnector | None = None,
    ) -> None:
        self.engine = engine
        self.connector = connector
        """The KV connector (``--kv-transfer-config``); None: requests may not carry kv_transfer_params."""
        self.load_publisher = load_publisher
        self.tokenizer = tokenizer
        self.served_model_name = served_model_name
        self.max_model_len = max_model_len
        self.model_root = model_root or served_model_name
        self.lora_modules = lora_modules
        self.adapters: dict[str, LoRARef] = lora_refs(lora_modules)
        self.created = int(time.time())
        self.grammars: GrammarCompiler | None = None
        """Built at startup when the runner can follow a grammar (about a second for a 49k vocabulary)."""

    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[openai_errors, self._load_mark_on_end], client_max_size=_MAX_BODY_BYTES)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model_id}", self.model)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_get("/tokenizer_info", self.tokenizer_info)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/stats", self.stats)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.on_startup.append(self._start_engine)
        app.on_cleanup.append(self._stop_engine)
        return app

    @web.middleware
    async def _load_mark_on_end(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Reads the request's load mark once (``generate`` acknowledges it on arrival); however the
        request ends (answered, refused, its client gone), its sender may take it as counted."""
        mark = request[_LOAD_MARK] = parse_load_mark(request.headers.get(LOAD_MARK_HEADER))
        try:
            return await handler(request)
        finally:
            self.engine.request_ended(mark)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = parse_request(await request.read(), CompletionRequest)
        adapter = self._adapter(body.model)
        transfer = self._transfer(body)
        prompt_ids = await asyncio.to_thread(completion_prompt_ids, body, self.tokenizer)
        constraint = await asyncio.to_thread(self._constraint, body, None)
        shape = self._shape(adapter, chat=False, logprobs=body.logprobs)
        if body.echo or body.prompt_logprobs is not None or body.requested_max_tokens == 0:
            if transfer != NO_TRANSFER:
                raise bad_request(f"{KV_TRANSFER_FIELD} cannot be combined with echo, prompt_logprobs or max_tokens 0",
                                  KV_TRANSFER_FIELD)  # fmt: skip
            return await self._scored_completion(request, body, prompt_ids, shape, adapter, constraint)
        return await self._generate(request, body, prompt_ids, shape, adapter, constraint, transfer)

    async def _scored_completion(
        self,
        request: web.Request,
        body: CompletionRequest,
        prompt_ids: list[int],
        shape: ResponseShape,
        adapter: LoRARef | None,
        constraint: Grammar | None,
    ) -> web.Response:
        """A completion that echoes or scores its prompt (``engine/server/logprobs_echo.py``); ``max_tokens`` 0 generates nothing."""
        check_scored_request(body, len(prompt_ids), self.max_model_len)
        top = scored_top(body)
        scored = await self.engine.prompt_logprobs(prompt_ids, top, adapter) if top is not None else None
        text = await asyncio.to_thread(prompt_text, body, prompt_ids, self._prompt_text)
        echo = PromptEcho(body, text, prompt_ids, scored, self._token_text)
        if body.requested_max_tokens == 0:
            return json_response(echo.prompt_only(self._model_name(adapter)))
        params = sampling_params(body, len(prompt_ids), self.max_model_len, self.tokenizer.vocab_size)
        params = dataclasses.replace(params, constraint=constraint)
        outputs = self._traced(request, prompt_ids, params, body.cache_salt, body.n, session_hint(body), adapter)
        choices = [Choice() for _ in range(body.n)]
        async with aclosing(outputs):
            async for output in outputs:
                choices[output.index].add(output)
        return json_response(echo.apply(shape.whole(choices)))

    def _prompt_text(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = parse_request(await request.read(), ChatCompletionRequest)
        refuse_chat_scoring(body)
        adapter = self._adapter(body.model)
        transfer = self._transfer(body)
        tools = tool_mode(body)
        prompt_ids = await asyncio.to_thread(chat_prompt_ids, body, self.tokenizer)
        constraint = await asyncio.to_thread(self._constraint, body, tools)
        shape = self._shape(adapter, chat=True, logprobs=body.num_logprobs, tools=tools)
        return await self._generate(request, body, prompt_ids, shape, adapter, constraint, transfer)

    async def embeddings(self, request: web.Request) -> web.Response:
        body = parse_request(await request.read(), EmbeddingRequest)
        adapter = self._adapter(body.model)
        inputs = await asyncio.to_thread(embedding_inputs, body, self.tokenizer, self.max_model_len)
        vectors = [await self.engine.embed(token_ids, adapter) for token_ids in inputs]
        num_tokens = sum(len(token_ids) for token_ids in inputs)
        return json_response(embeddings_response(self._model_name(adapter), vectors, num_tokens, body))

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = parse_request(await request.read(), ResponsesRequest)
        adapter = self._adapter(body.model)
        if (body.model_extra or {}).get(KV_TRANSFER_FIELD) is not None:
            raise bad_request(f"{KV_TRANSFER_FIELD} is taken on /v1/completions and /v1/chat/completions only",
                              KV_TRANSFER_FIELD, "unsupported_parameter")  # fmt: skip
        tools = responses_tool_mode(body)
        prompt_ids = await asyncio.to_thread(responses_prompt_ids, body, self.tokenizer)
        constraint = await asyncio.to_thread(responses_grammar, body, tools, self.grammars)
        params = sampling_params(body, len(prompt_ids), self.max_model_len, self.tokenizer.vocab_size)
        params = dataclasses.replace(params, constraint=constraint)
        builder = ResponseBuilder(self._model_name(adapter), body, tools)
        outputs = self._traced(request, prompt_ids, params, body.cache_salt, 1, adapter=adapter)
        async with aclosing(outputs):
            if body.stream:
                return await self._stream_response(request, outputs, ResponseStream(builder))
            text: list[str] = []
            final: RequestOutput | None = None
            async for output in outputs:
                text.append(output.text)
                final = output
            assert final is not None
            return json_response(builder.response(builder.output_items("".join(text), final), final))

    async def _traced(
        self,
        request: web.Request,
        prompt_ids: list[int],
        params: SamplingParams,
        cache_salt: str | None,
        n: int,
        session: SessionHint | None = None,
        adapter: LoRARef | None = None,
        hold_kv: bool = False,
        remote_kv: RemoteKV | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """The engine's outputs; each finished sample also leaves its spans in the caller's trace."""
        parent = remote_parent(request.headers)
        request_id = request.headers.get("x-request-id", "")
        outputs = self.engine.generate(
            prompt_ids,
            params,
            self.max_model_len,
            self.tokenizer.eos_token_id,
            cache_salt,
            session=session.key if session else None,
            session_ttl_s=session.ttl_s if session else None,
            n=n,
            adapter=adapter,
            hold_kv=hold_kv,
            remote_kv=remote_kv,
            load_mark=request[_LOAD_MARK],
        )
        async with aclosing(outputs):
            async for output in outputs:
                if output.finished:
                    record_spans(parent, output, request_id)
                yield output

    def _transfer(self, body: CompletionRequest | ChatCompletionRequest) -> TransferRequest:
        """The request's ``kv_transfer_params``, checked; a 400 naming it without a KV connector."""
        value = (body.model_extra or {}).get(KV_TRANSFER_FIELD)
        if value is None:
            return NO_TRANSFER
        if self.connector is None:
            raise bad_request(
                f"{KV_TRANSFER_FIELD} needs an engine started with --kv-transfer-config (disaggregated prefill/decode)",
                KV_TRANSFER_FIELD,
                "unsupported_parameter",
            )
        transfer = transfer_request(value)
        if transfer.remote_decode and (body.n != 1 or body.stream):
            raise bad_request(f"{KV_TRANSFER_FIELD}.do_remote_decode needs n 1 and stream false", KV_TRANSFER_FIELD)
        return transfer

    async def _pull(self, transfer: TransferRequest, prompt_ids: list[int], cache_salt: str | None,
                    adapter: LoRARef | None) -> RemoteKV | None:  # fmt: skip
        """A decode leg's missing prompt blocks, pulled from the prefill engine (None: prefill locally)."""
        if transfer.source is None or self.connector is None:
            return None
        held, hashes = await self.engine.prefix_hit_blocks(prompt_ids, cache_salt, adapter)
        return await self.connector.fetch(transfer, held, hashes)

    def _adapter(self, requested: str | None) -> LoRARef | None:
        return check_model(requested, self.served_model_name, self.adapters)

    def _model_name(self, adapter: LoRARef | None) -> str:
        """The ``model`` a response reports: the adapter's name for an adapter request, as vLLM does."""
        return adapter.name if adapter is not None else self.served_model_name

    def _shape(
        self, adapter: LoRARef | None, chat: bool, logprobs: int | None, tools: ToolMode | None = None
    ) -> ResponseShape:
        token_text = self._token_text if logprobs is not None else _no_token_text
        return ResponseShape(self._model_name(adapter), chat, token_text, logprobs is not None, tools)

    def _constraint(self, body: CompletionRequest | ChatCompletionRequest, tools: ToolMode | None) -> Grammar | None:
        """The grammar the answer must follow (structured outputs, a forced tool call), checked; runs off the loop."""
        forced = tools is not None and tools.kind in ("named", "required")
        if self.grammars is None:
            fields = constraint_fields(body) + (["tool_choice"] if forced else [])
            if fields:
                raise bad_request(
                    f"{fields[0]} needs constrained decoding, which this engine's runner (--sim) cannot do",
                    fields[0],
                    "unsupported_parameter",
                )
            return None
        structured = requested_grammar(body, self.grammars)
        tool = tool_grammar(tools, self.grammars) if tools is not None else None
        if structured is not None and tool is not None:
            raise bad_request(
                f"a forced tool call cannot also follow {structured.param}: give one of them", "tool_choice"
            )
        return structured or tool

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    async def models(self, request: web.Request) -> web.Response:
        """The base model and each LoRA adapter (``parent``: the base model, ``root``: its folder), as vLLM lists them."""
        base = self._model_card(self.served_model_name, self.model_root, None)
        adapters = [
            self._model_card(module.name, str(module.path), self.served_model_name) for module in self.lora_modules
        ]
        return json_response({"object": "list", "data": [base, *adapters]})

    async def model(self, request: web.Request) -> web.Response:
        """One model object (``openai.models.retrieve``); an unknown id is a 404 in OpenAI's shape."""
        model_id = request.match_info["model_id"]
        adapter = check_model(model_id, self.served_model_name, self.adapters)
        if adapter is None:
            return json_response(self._model_card(self.served_model_name, self.model_root, None))
        module = next(module for module in self.lora_modules if module.name == adapter.name)
        return json_response(self._model_card(module.name, str(module.path), self.served_model_name))

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``/tokenize``: a prompt, or messages through the chat template (``normalize/tokenizer_api.py``)."""
        body = parse_tokenize(parse_json(await request.read()))
        self._adapter(body.model)
        text = await asyncio.to_thread(tokenize_text, body, self.tokenizer)
        return json_response(await asyncio.to_thread(tokenize_body, body, text, self.tokenizer, self.max_model_len))

    async def detokenize(self, request: web.Request) -> web.Response:
        body = parse_detokenize(parse_json(await request.read()))
        self._adapter(body.model)
        return json_response(await asyncio.to_thread(detokenize_body, body, self.tokenizer))

    async def tokenizer_info(self, request: web.Request) -> web.Response:
        return json_response(await asyncio.to_thread(tokenizer_info, self.tokenizer))

    def _model_card(self, name: str, root: str, parent: str | None) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": self.created,
            "owned_by": "kvgate",
            "root": root,
            "parent": parent,
            "max_model_len": self.max_model_len,
        }

    async def health(self, request: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.engine.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def stats(self, request: web.Request) -> web.Response:
        return web.Response(body=encode_stats(self.engine.stats()), content_type="application/json")

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.engine.reset_prefix_cache()
        return json_response({"status": "ok"})

    async def _generate(
        self,
        request: web.Request,
        body: CompletionRequest | ChatCompletionRequest,
        prompt_ids: list[int],
        shape: ResponseShape,
        adapter: LoRARef | None,
        constraint: Grammar | None = None,
        transfer: TransferRequest = NO_TRANSFER,
    ) -> web.StreamResponse:
        params = sampling_params(body, len(prompt_ids), self.max_model_len, self.tokenizer.vocab_size)
        if constraint is not None:
            params = dataclasses.replace(params, constraint=constraint)
        remote_kv = await self._pull(transfer, prompt_ids, body.cache_salt, adapter)
        outputs = self._traced(
            request, prompt_ids, params, body.cache_salt, body.n, session_hint(body), adapter,
            hold_kv=transfer.remote_decode, remote_kv=remote_kv,
        )  # fmt: skip
        async with aclosing(outputs):
            if body.stream:
                return await self._stream(request, outputs, shape, body.n, body.include_usage)
            choices = [Choice() for _ in range(body.n)]
            async for output in outputs:
                choices[output.index].add(output)
            answer = shape.whole(choices)
            if transfer.remote_decode and self.connector is not None:
                last = choices[0].last
                answer["kv_transfer_params"] = self.connector.prefill_answer(last.kv_hold if last else None)
            return json_response(answer)

    async def _stream(
        self,
        request: web.Request,
        outputs: AsyncIterator[RequestOutput],
        shape: ResponseShape,
        n: int,
        include_usage: bool,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        started: set[int] = set()
        finals: list[RequestOutput] = []
        try:
            async for output in outputs:
                if output.text or output.finished or output.logprobs is not None:
                    for chunk in shape.chunks(output, first=output.index not in started):
                        await _send_event(response, chunk)
                        started.add(output.index)
                if output.finished:
                    finals.append(output)
            if include_usage:
                await _send_event(response, shape.usage_chunk(finals))
        except EngineError as exc:
            await _send_event(response, error_body(str(exc), "internal_error"))
        except ConnectionResetError:
            log.debug("client of %s went away mid-stream", shape.request_id)
            return response
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _stream_response(
        self, request: web.Request, outputs: AsyncIterator[RequestOutput], stream: ResponseStream
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        try:
            for event in stream.opening():
                await _send_named_event(response, event)
            async for output in outputs:
                for event in stream.feed(output):
                    await _send_named_event(response, event)
        except EngineError as exc:
            await _send_named_event(response, {"type": "error", "message": str(exc), "code": "internal_error"})
        except ConnectionResetError:
            log.debug("client of %s went away mid-stream", stream.builder.response_id)
            return response
        await response.write_eof()
        return response

    async def _start_engine(self, app: web.Application) -> None:
        if self.engine.runner.constrained_decoding:
            self.grammars = await asyncio.to_thread(GrammarCompiler, self.tokenizer)
        self.engine.start(asyncio.get_running_loop())
        if self.connector is not None:
            await self.connector.start()
        if self.load_publisher is not None:
            self.load_publisher.start()
        freeze_startup_objects()

    async def _stop_engine(self, app: web.Application) -> None:
        if self.connector is not None:
            await self.connector.stop()
        if self.load_publisher is not None:
            await asyncio.to_thread(self.load_publisher.stop)
        await asyncio.to_thread(self.engine.stop)


async def _send_event(response: web.StreamResponse, data: dict[str, Any]) -> None:
    await response.write(b"data: " + orjson.dumps(data) + b"\n\n")


async def _send_named_event(response: web.StreamResponse, data: dict[str, Any]) -> None:
    """A Responses API event: its type as the SSE ``event:`` and the whole event as ``data:``."""
    await response.write(b"event: " + data["type"].encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n")


def _no_token_text(token_id: int) -> str:
    raise AssertionError("token text asked for without logprobs")
