"""The OpenAI-compatible HTTP server: `create_app(llm)` returns a FastAPI app over one engine.

    POST /v1/completions         {"prompt": ..., "max_tokens": ..., "stream": ...}
    POST /v1/chat/completions    {"messages": [...], ...}        (the model's chat template applies)
    GET  /v1/models  /health  /metrics

Streaming answers are server-sent events: one `data: {json}` chunk per step that adds text, then
`data: [DONE]`. Bad input gets a 4xx with OpenAI's error body and the server keeps serving; a client
that disconnects mid-stream aborts its request, which frees its KV blocks.
"""
from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from ..engine.llm import LLM
from .async_engine import AsyncEngine, EngineDead
from .metrics import ServerMetrics
from .protocol import (ChatCompletionRequest, CompletionRequest, OpenAIError, SamplingFields, choice,
                       completion_body, new_id, usage)


def create_app(llm: LLM, served_model_name: str = "SmolLM2-135M-Instruct", default_max_tokens: int = 16,
               engine_thread: bool = True) -> FastAPI:
    """A FastAPI app serving `llm` under the name `served_model_name` (what clients pass as `model`).

    `engine_thread=False`: the engine is stepped by whoever calls `app.state.engine.run()` (see `AsyncEngine`).
    """
    engine = AsyncEngine(llm.engine, start_thread=engine_thread)
    metrics = ServerMetrics(engine, served_model_name)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        engine.shutdown()  # uvicorn has let open requests finish (or timed them out) before this runs

    app = FastAPI(title="course_lib OpenAI-compatible server", lifespan=lifespan)
    app.state.engine, app.state.metrics = engine, metrics

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, e: OpenAIError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError):
        first = e.errors()[0]  # malformed JSON, a missing field, a wrong type
        loc = [str(part) for part in first.get("loc", ())[1:]]  # drop "body"
        param = ".".join(loc) if loc and first.get("type") != "json_invalid" else None
        message = f"{param}: {first['msg']}" if param else f"invalid request body: {first['msg']}"
        return JSONResponse(OpenAIError(message, param).body(), status_code=400)

    @app.exception_handler(EngineDead)
    async def engine_dead(request: Request, e: EngineDead):
        return JSONResponse(OpenAIError(str(e), status=503, type="server_error").body(), status_code=503)

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served_model_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "course_lib", "max_model_len": llm.engine.max_model_len}]}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        return await serve(body, body.single_prompt(), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest):
        try:
            prompt = llm.tokenizer.encode_chat([m.model_dump() for m in body.messages])
        except (TypeError, ValueError) as e:
            raise OpenAIError(str(e), "messages") from e
        return await serve(body, prompt, chat=True)

    async def serve(body: SamplingFields, prompt: str | list[int], chat: bool):
        if body.model is not None and body.model != served_model_name:
            raise OpenAIError(f"the model {body.model!r} does not exist; this server serves {served_model_name!r}",
                              "model", status=404, code="model_not_found")
        params = body.sampling_params(default_max_tokens)
        try:  # a prompt longer than the context, a stop id outside the vocab; the ids are the engine's input
            prompt = llm.engine.check_request(prompt, params)
        except (TypeError, ValueError) as e:  # the engine's errors name their field in `param`
            param = getattr(e, "param", None)
            if param in (None, "prompt"):  # a chat's prompt is made from its messages
                param = "messages" if chat else "prompt"
            raise OpenAIError(str(e), param) from e
        request_id = new_id("chatcmpl" if chat else "cmpl")
        outputs = engine.generate(prompt, params, request_id)
        if body.stream:
            return StreamingResponse(stream(outputs, request_id, chat, body.include_usage),
                                     media_type="text/event-stream")
        counted, final = 0, None
        async for out in outputs:
            counted, final = metrics.observe(out, counted), out
        c = final.outputs[0]
        return completion_body(request_id, served_model_name, [choice(c.text, c.finish_reason, chat, chunk=False)],
                               chat, chunk=False, usage_counts=usage(len(final.prompt_token_ids), len(c.token_ids)))

    async def stream(outputs, request_id: str, chat: bool, include_usage: bool) -> AsyncIterator[str]:
        def event(choices: list[dict], usage_counts: dict | None = None) -> str:
            body = completion_body(request_id, served_model_name, choices, chat, chunk=True, usage_counts=usage_counts)
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        if chat:  # the first chunk names the role, as OpenAI's does
            yield event([choice("", None, chat, chunk=True, role=True)])
        counted, final = 0, None
        try:
            async for out in outputs:
                counted, final = metrics.observe(out, counted), out
                if out.delta or out.finished:
                    reason = out.outputs[0].finish_reason if out.finished else None
                    yield event([choice(out.delta or None, reason, chat, chunk=True)])
        except EngineDead as e:  # the status line is sent: say it in the stream, then end it
            yield f"data: {json.dumps(OpenAIError(str(e), type='server_error').body())}\n\n"
        if include_usage and final is not None:
            yield event([], usage(len(final.prompt_token_ids), len(final.outputs[0].token_ids)))
        yield "data: [DONE]\n\n"

    return app
