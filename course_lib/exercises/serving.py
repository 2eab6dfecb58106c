"""Checkers for chapter 10 (serving): reading a server-sent event stream by hand.

    check_sse_text(sse_text, lines=raw_lines, want=whole_text)   # lines captured from the server in the notebook
"""
from __future__ import annotations

import json
from typing import Callable

from .check import Case, run_checks


def _event(choice: dict) -> str:
    return "data: " + json.dumps({"id": "x", "object": "chat.completion.chunk", "choices": [choice]})


CHAT = [_event({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}), "",
        _event({"index": 0, "delta": {"content": "你好"}, "finish_reason": None}), "",
        ": keep-alive comment", "",
        _event({"index": 0, "delta": {"content": ", world"}, "finish_reason": None}), "",
        _event({"index": 0, "delta": {}, "finish_reason": "stop"}), "",
        "data: " + json.dumps({"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}), "",
        "data: [DONE]", ""]
COMPLETION = [_event({"index": 0, "text": "The", "finish_reason": None}),
              _event({"index": 0, "text": " end", "finish_reason": "length"}), "data: [DONE]",
              _event({"index": 0, "text": " (after DONE: not part of the answer)", "finish_reason": None})]


def reference_sse_text(lines: list[str]) -> str:
    """The answer the checker compares with: every content delta (chat) or text (completions) until [DONE]."""
    text = []
    for line in lines:
        if not line.startswith("data: "):
            continue  # blank separators and ": comments"
        data = line[len("data: "):]
        if data == "[DONE]":
            break
        for choice in json.loads(data).get("choices", []):
            text.append(choice.get("text") or choice.get("delta", {}).get("content") or "")
    return "".join(text)


def check_sse_text(fn: Callable[[list[str]], str], lines: list[str] | None = None, want: str | None = None) -> bool:
    """`fn(lines) -> text`: the text a streamed /v1/completions or /v1/chat/completions answer carries."""

    def equals(expected: str) -> Callable[[str], None]:
        def verify(got: str) -> None:
            assert isinstance(got, str), f"return a str, got {type(got).__name__}"
            assert got == expected, f"expected {expected!r}, got {got!r}"
        return verify

    cases = [Case("a chat stream: role chunk, content deltas, a comment line, a usage chunk with no choices",
                  (list(CHAT),), equals("你好, world")),
             Case("a completions stream: 'text' instead of 'delta'; nothing after [DONE] counts",
                  (list(COMPLETION),), equals("The end")),
             Case("a stream with no content at all", (["data: [DONE]"],), equals(""))]
    if lines is not None:
        expected = want if want is not None else reference_sse_text(lines)
        cases.append(Case(f"the {len(lines)} lines this notebook's server sent", (list(lines),), equals(expected)))
    return run_checks("sse_text", fn, cases)
