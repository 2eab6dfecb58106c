"""The OpenAI-compatible HTTP server: `create_app(llm)` returns a FastAPI app over one engine.

    POST /v1/completions         {"prompt": ..., "max_tokens": ..., "stream": ...}
    POST /v1/chat/completions    {"messages": [...], ...}        (the model's chat template applies)
    GET  /v1/models  /health  /metrics

Streaming answers are server-sent events: one `data: {json}` chunk per step that adds text, then
`data: [DONE]`. Every error has OpenAI's shape and status; the body is parsed, tokenized and checked in a
worker thread, so a large prompt never stalls other clients. A client that disconnects, streaming or
not, aborts its request at once, which frees its KV blocks. `guards.py` checks host, key and sizes first.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager, suppress

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from ..engine.llm import LLM
from ..engine.sequence import RequestOutput
from ..sampling import SamplingParams
from .async_engine import AsyncEngine, EngineDead
from .guards import BodyTooLarge, Guard, ServeConfig, too_large
from .metrics import ServerMetrics
from .protocol import (ChatCompletionRequest, CompletionRequest, OpenAIError, SamplingFields, choice,
                       completion_body, new_id, parse_body, usage)


def respond(error: OpenAIError, headers: dict | None = None) -> JSONResponse:
    """`error` as OpenAI sends it: its body, with its status."""
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


class EventStream(StreamingResponse):
    """Server-sent events whose generator is closed however the response ends, so a client that leaves
    aborts its request now rather than whenever the generator is garbage-collected."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


async def disconnected(request: Request) -> None:
    """Return when the client closes the connection (the body has been read; only a disconnect can come)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable):
    """Run `work`; if the client disconnects first, cancel it (which aborts its request) and return None.

    vLLM's `with_cancellation` does the same: a non-streaming client that gives up must not leave its
    whole generation running."""
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
    return None if task.cancelled() else task.result()


async def within(outputs: AsyncIterator[RequestOutput], seconds: float | None) -> AsyncIterator[RequestOutput]:
    """`outputs` until `seconds` have passed; then the request is aborted and a 408 raised."""
    loop = asyncio.get_running_loop()
    deadline = None if seconds is None else loop.time() + seconds
    try:
        while True:
            try:
                left = None if deadline is None else max(deadline - loop.time(), 0)
                out = await asyncio.wait_for(anext(outputs), left)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise OpenAIError(f"the request did not finish within {seconds:g} s (--request-timeout) and was "
                                  "aborted", status=408, type="timeout_error", code="request_timeout") from None
            yield out
    finally:
        await outputs.aclose()


class Server:
    """What the handlers share: the engine (stepped by an `AsyncEngine`), its metrics, the limits, the model's name."""

    def __init__(self, llm: LLM, served_model_name: str, default_max_tokens: int, engine_thread: bool,
                 config: ServeConfig):
        self.llm, self.name, self.default_max_tokens, self.config = llm, served_model_name, default_max_tokens, config
        self.engine = AsyncEngine(llm.engine, start_thread=engine_thread)
        self.metrics = ServerMetrics(self.engine, served_model_name)
        self.window = llm.engine.max_model_len

    def prepare(self, raw: bytes, chat: bool) -> tuple[SamplingFields, list[int], SamplingParams]:
        """Body bytes -> (request, prompt ids, params): parse, tokenize, check. Runs in a worker thread."""
        body = parse_body(raw, ChatCompletionRequest if chat else CompletionRequest)
        if body.model is not None and body.model != self.name:
            raise OpenAIError(f"the model {body.model!r} does not exist; this server serves {self.name!r}",
                              "model", status=404, code="model_not_found")
        params = body.sampling_params(self.default_max_tokens)
        try:  # a template error, a prompt longer than the context, a stop id outside the vocab
            prompt = self.llm.tokenizer.encode_chat([m.model_dump(exclude={"name"}) for m in body.messages]) \
                if chat else body.single_prompt()
            ids = self.llm.engine.check_request(prompt, params)
        except (TypeError, ValueError) as e:  # the engine's errors name their field in `param`
            param = getattr(e, "param", None)
            if param in (None, "prompt"):  # a chat's prompt is made from its messages
                param = "messages" if chat else "prompt"
            raise OpenAIError(str(e), param) from e
        return body, ids, self.fit_window(params, len(ids), asked=body.max_tokens is not None, chat=chat)

    def fit_window(self, params: SamplingParams, prompt_len: int, asked: bool, chat: bool) -> SamplingParams:
        """Prompt + max_tokens within the context window: asking for more is a 400, as with OpenAI and vLLM
        (not a silent cut); the default max_tokens shrinks to what fits."""
        room = self.window - prompt_len
        if params.max_tokens <= room:
            return params
        if not asked:
            return dataclasses.replace(params, max_tokens=room)
        raise OpenAIError(f"this model's context window (max_model_len) is {self.window} tokens, but "
                          f"{prompt_len + params.max_tokens} were requested ({prompt_len} in the "
                          f"{'messages' if chat else 'prompt'}, {params.max_tokens} in the completion): reduce "
                          f"max_tokens to at most {room} or shorten the prompt", "max_tokens")

    async def serve(self, request: Request, chat: bool):
        """One completion: checked off the event loop, generated, answered whole or as server-sent events."""
        if (error := self.engine.unavailable()) is not None:
            raise error
        body, ids, params = await asyncio.to_thread(self.prepare, await request.body(), chat)
        request_id = new_id("chatcmpl" if chat else "cmpl")
        outputs = within(self.engine.generate(ids, params, request_id), self.config.request_timeout)
        if body.stream:
            return EventStream(self.stream(outputs, request_id, chat, body.include_usage),
                               media_type="text/event-stream")
        final = await unless_disconnected(request, self.collect(outputs))
        if final is None:
            return Response(status_code=499)  # the client has gone: nobody reads this (nginx's "client closed")
        c = final.outputs[0]
        return completion_body(request_id, self.name, [choice(c.text, c.finish_reason, chat, chunk=False)],
                               chat, chunk=False, usage_counts=usage(len(final.prompt_token_ids), len(c.token_ids)))

    async def collect(self, outputs: AsyncIterator[RequestOutput]) -> RequestOutput:
        counted, final = 0, None
        async for out in outputs:
            counted, final = self.metrics.observe(out, counted), out
        return final

    async def stream(self, outputs, request_id: str, chat: bool, include_usage: bool) -> AsyncIterator[str]:
        def event(choices: list[dict], usage_counts: dict | None = None) -> str:
            body = completion_body(request_id, self.name, choices, chat, chunk=True, usage_counts=usage_counts)
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        try:
            if chat:  # the first chunk names the role, as OpenAI's does
                yield event([choice("", None, chat, chunk=True, role=True)])
            counted, final = 0, None
            try:
                async for out in outputs:
                    counted, final = self.metrics.observe(out, counted), out
                    if out.delta or out.finished:
                        reason = out.outputs[0].finish_reason if out.finished else None
                        yield event([choice(out.delta or None, reason, chat, chunk=True)])
            except EngineDead as e:  # the status line is sent: say it in the stream, then end it
                yield f"data: {json.dumps(OpenAIError(str(e), status=e.status, type='server_error').body())}\n\n"
            except OpenAIError as e:  # the deadline passed
                yield f"data: {json.dumps(e.body())}\n\n"
            if include_usage and final is not None:
                yield event([], usage(len(final.prompt_token_ids), len(final.outputs[0].token_ids)))
            yield "data: [DONE]\n\n"
        finally:
            await outputs.aclose()


routes = APIRouter()


def server_of(request: Request) -> Server:
    return request.app.state.server


@routes.get("/health")
async def health(request: Request):
    """200 while the engine serves; 503 with the reason once a step has failed or the server stops."""
    if (error := server_of(request).engine.unavailable()) is not None:
        return respond(OpenAIError(str(error), status=503, type="server_error"))
    return {"status": "ok"}


@routes.get("/v1/models")
async def models(request: Request):
    server = server_of(request)
    return {"object": "list", "data": [{"id": server.name, "object": "model", "created": int(time.time()),
                                        "owned_by": "course_lib", "max_model_len": server.window}]}


@routes.get("/metrics")
async def prometheus(request: Request):
    return Response(server_of(request).metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


@routes.post("/v1/completions")
async def completions(request: Request):
    return await server_of(request).serve(request, chat=False)


@routes.post("/v1/chat/completions")
async def chat_completions(request: Request):
    return await server_of(request).serve(request, chat=True)


async def openai_error(request: Request, e: OpenAIError):
    return respond(e)


async def engine_dead(request: Request, e: EngineDead):
    return respond(OpenAIError(str(e), status=e.status, type="server_error"))


async def body_too_large(request: Request, e: BodyTooLarge):
    return respond(too_large(server_of(request).config.max_body_bytes))


async def http_error(request: Request, e: HTTPException):
    """404, 405 and whatever else Starlette answers itself, in OpenAI's shape."""
    return respond(OpenAIError(f"{request.method} {request.url.path}: {e.detail}", status=e.status_code), e.headers)


async def server_error(request: Request, e: Exception):
    return respond(OpenAIError(f"internal server error: {type(e).__name__}: {e}", status=500, type="server_error"))


ERROR_HANDLERS = {OpenAIError: openai_error, EngineDead: engine_dead, BodyTooLarge: body_too_large,
                  HTTPException: http_error, Exception: server_error}


@asynccontextmanager
async def lifespan(app: FastAPI):
    yield
    app.state.engine.shutdown()  # uvicorn has let open requests finish (or timed them out) before this runs


def create_app(llm: LLM, served_model_name: str = "SmolLM2-135M-Instruct", default_max_tokens: int = 16,
               engine_thread: bool = True, config: ServeConfig | None = None) -> FastAPI:
    """A FastAPI app serving `llm` under the name `served_model_name` (what clients pass as `model`).

    `engine_thread=False`: the engine is stepped by whoever calls `app.state.engine.run()` (see `AsyncEngine`).
    `config`: API key, allowed hosts, size, concurrency and time limits (see `ServeConfig`).
    """
    config = config or ServeConfig()
    server = Server(llm, served_model_name, default_max_tokens, engine_thread, config)
    app = FastAPI(title="course_lib OpenAI-compatible server", lifespan=lifespan)
    app.add_middleware(Guard, config=config)
    for error, handler in ERROR_HANDLERS.items():
        app.add_exception_handler(error, handler)
    app.include_router(routes)
    app.state.server = server
    app.state.engine, app.state.metrics, app.state.config = server.engine, server.metrics, config
    return app
