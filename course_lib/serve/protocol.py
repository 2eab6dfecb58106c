"""The OpenAI wire format: request bodies in, `SamplingParams` out, response and chunk bodies back.

Field names, defaults and ranges follow OpenAI's API reference; vLLM's extra sampling fields (`top_k`,
`min_p`, `repetition_penalty`, `ignore_eos`, `stop_token_ids`, `skip_special_tokens`) are accepted too.
Types are strict, as OpenAI's are (`"max_tokens": "10"` is a 400, not 10), and a field this server does not
implement is refused with a 400 naming it, never silently ignored.
"""
from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..sampling import SamplingParams

TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}  # pydantic names union members in `loc`


class OpenAIError(Exception):
    """An error the client caused or can act on, sent as {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def parse_body(raw: bytes, model: type[BaseModel]) -> BaseModel:
    """A request body (bytes) as `model`: invalid UTF-8, lone surrogates, bad JSON or a wrong type is a 400."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        first = e.errors()[0]
        if first["type"] == "json_invalid" or not first["loc"]:
            raise OpenAIError(f"the body is not a JSON object in UTF-8: {first['msg']}", code="invalid_json") from e
        parts = [first["loc"][0]] + [p for p in first["loc"][1:] if isinstance(p, int) or
                                     (str(p).isidentifier() and str(p) not in TYPE_TAGS)]
        param = ".".join(str(p) for p in parts)
        if first["type"] == "extra_forbidden":
            raise OpenAIError(f"unrecognized request argument supplied: {param}", param) from e
        if param == "prompt":
            raise OpenAIError("prompt must be a string, a list of token ids (integers), or a list of one of "
                              "those", param) from e
        raise OpenAIError(f"{param}: {first['msg']}", param) from e


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class SamplingFields(BaseModel):
    """What both endpoints share."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = 1.0
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # an end-user id: recorded by OpenAI, no effect on the output
    # vLLM's extra sampling parameters
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True

    def refuse_unsupported(self) -> None:
        """A 400 naming the first field set to something this server does not implement."""
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) != 0:
                raise OpenAIError(f"{name} is not supported by this server (use repetition_penalty)", name)

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        """The engine's `SamplingParams`; a value out of range raises `OpenAIError` naming the field."""
        self.refuse_unsupported()
        try:
            return SamplingParams(
                max_tokens=self.max_tokens or default_max_tokens, temperature=self.temperature, top_p=self.top_p,
                top_k=self.top_k, min_p=self.min_p, repetition_penalty=self.repetition_penalty, seed=self.seed,
                stop=self.stop, stop_token_ids=self.stop_token_ids or [], ignore_eos=self.ignore_eos,
                skip_special_tokens=self.skip_special_tokens, n=self.n, logit_bias=self.logit_bias)
        except (TypeError, ValueError) as e:  # `checks.invalid` names the field: "SamplingParams.top_p" -> "top_p"
            raise OpenAIError(str(e).replace("SamplingParams.", ""), getattr(e, "param", None)) from e

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        for name, unset in (("echo", False), ("logprobs", None), ("suffix", None)):
            if getattr(self, name) != unset:
                raise OpenAIError(f"{name} is not supported by this server", name)
        if self.best_of not in (None, 1):
            raise OpenAIError("best_of is not supported by this server (one completion per request)", "best_of")

    def single_prompt(self) -> str | list[int]:
        """The one prompt of this request (a list of one prompt is accepted); one completion per request."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise OpenAIError(f"this server takes one prompt per request, got {len(prompt)}", "prompt")
            prompt = prompt[0]
        return prompt


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "user", "assistant"]
    content: str
    name: str | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    response_format: dict | None = None
    tools: list | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.logprobs or self.top_logprobs is not None:
            raise OpenAIError("logprobs are not supported by this server",
                              "logprobs" if self.logprobs else "top_logprobs")
        if self.response_format not in (None, {"type": "text"}):
            raise OpenAIError("response_format: only {\"type\": \"text\"} is supported by this server "
                              "(no JSON mode or schema-constrained decoding)", "response_format")
        if self.tools:
            raise OpenAIError("tools are not supported by this server (no function calling)", "tools")
        if self.tool_choice not in (None, "none"):
            raise OpenAIError("tool_choice is not supported by this server (no function calling)", "tool_choice")
        if any(m.name is not None for m in self.messages):
            raise OpenAIError("messages[].name is not supported by this server's chat template", "messages")

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return super().sampling_params(default_max_tokens)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(request_id: str, model: str, choices: list[dict], chat: bool, chunk: bool,
                    usage_counts: dict | None = None) -> dict:
    """A response (`chunk=False`) or a streamed chunk of /v1/completions or /v1/chat/completions."""
    kind = ("chat.completion" if chat else "text_completion") + (".chunk" if chunk and chat else "")
    body = {"id": request_id, "object": kind, "created": int(time.time()), "model": model, "choices": choices}
    if usage_counts is not None or not chunk:
        body["usage"] = usage_counts
    return body


def choice(text: str | None, finish_reason: str | None, chat: bool, chunk: bool, role: bool = False) -> dict:
    """One choice: {"text"} for completions, {"message"} (or {"delta"} when streaming) for chat."""
    out: dict = {"index": 0}
    if not chat:
        out.update(text=text or "", logprobs=None)
    elif chunk:
        delta = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        out["delta"] = delta
    else:
        out["message"] = {"role": "assistant", "content": text or ""}
    out["finish_reason"] = finish_reason
    return out
