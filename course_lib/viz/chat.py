"""A chat box for the notebooks: the reply streams in token by token, with live TTFT and tokens/s (chapter 10).

    chat_widget(llm)          # type, press Enter or Send; Stop aborts the reply (its KV blocks are freed)

`ChatSession` does the work and is tested; `chat_widget` is ipywidgets glue around it. The reply is
generated in a background thread, so the notebook stays usable while it streams, and other cells
may call `llm.generate` meanwhile: the engine batches them together.
"""
from __future__ import annotations

import html
import threading
import time
from contextlib import closing
from dataclasses import dataclass, field
from typing import Callable

from ..sampling import SamplingParams


def default_params() -> SamplingParams:
    """The chat box's sampling, shared by `ChatSession` and `chat_widget`: a little randomness, up to 128 tokens."""
    return SamplingParams(max_tokens=128, temperature=0.7)


@dataclass
class ReplyStats:
    """How one reply went, measured where the text arrives (the notebook), not inside the engine."""

    tokens: int = 0
    ttft: float | None = None  # seconds from send to the first token (首字延迟)
    seconds: float = 0.0  # from send to the last token
    finish_reason: str | None = None

    @property
    def tokens_per_s(self) -> float | None:
        """Decode speed: tokens after the first over the time after the first."""
        if self.ttft is None or self.tokens < 2 or self.seconds <= self.ttft:
            return None
        return (self.tokens - 1) / (self.seconds - self.ttft)

    def readout(self) -> str:
        ttft = "TTFT –" if self.ttft is None else f"TTFT {self.ttft * 1e3:.0f} ms"
        speed = "" if self.tokens_per_s is None else f" · {self.tokens_per_s:.1f} tok/s"
        done = f" · {self.finish_reason}" if self.finish_reason else ""
        return f"{ttft}{speed} · {self.tokens} tokens{done}"


@dataclass
class ChatSession:
    """A conversation with `llm`: the chat template applied to the whole history on every turn."""

    llm: object  # course_lib.LLM
    params: SamplingParams = field(default_factory=default_params)
    messages: list[dict] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def send(self, text: str, on_update: Callable[[str, ReplyStats], None] | None = None) -> tuple[str, ReplyStats]:
        """Add the user's `text`, stream the reply (calling `on_update(reply_so_far, stats)` per step),
        add the reply to the history; returns it with its stats. `stop()` from another thread ends it."""
        self._stop.clear()
        self.messages.append({"role": "user", "content": text})
        engine, stats, reply = self.llm.engine, ReplyStats(), ""
        t0 = time.perf_counter()
        [rid] = engine.add_requests([self.llm.tokenizer.encode_chat(self.messages)], [self.params])
        with closing(engine.outputs([rid])) as outputs:  # leaving early aborts the request
            for out in outputs:
                now = time.perf_counter()
                stats.tokens = len(out.outputs[0].token_ids)
                if stats.ttft is None and stats.tokens:
                    stats.ttft = now - t0
                stats.seconds, stats.finish_reason = now - t0, out.outputs[0].finish_reason
                reply += out.delta
                if on_update is not None:
                    on_update(reply, stats)
                if self._stop.is_set():
                    stats.finish_reason = "stopped"
                    break
        self.messages.append({"role": "assistant", "content": reply})
        return reply, stats

    def stop(self) -> None:
        self._stop.set()


def render_messages(messages: list[dict], pending: str | None = None) -> str:
    """The conversation as HTML bubbles (text escaped); `pending` is the reply still streaming."""
    rows = list(messages) + ([{"role": "assistant", "content": pending + " ▌"}] if pending is not None else [])
    bubbles = []
    for m in rows:
        user = m["role"] == "user"
        style = ("margin:4px 0 4px 20%;background:#e3f0ff" if user else "margin:4px 20% 4px 0;background:#f2f2f2")
        bubbles.append(f'<div style="{style};padding:6px 10px;border-radius:8px;white-space:pre-wrap">'
                       f"{html.escape(m['content'])}</div>")
    return "".join(bubbles)


def chat_widget(llm, params: SamplingParams | None = None, system: str | None = None):
    """An ipywidgets chat box over `llm` (needs ipywidgets); returns the widget to display.

    `params` defaults to `default_params()`; `system`, if given, opens the conversation as its system prompt."""
    import ipywidgets as widgets

    session = ChatSession(llm, params or default_params(), [{"role": "system", "content": system}] if system else [])
    log = widgets.HTML(layout=widgets.Layout(max_height="320px", overflow_y="auto", border="1px solid #ddd"))
    box = widgets.Text(placeholder="Message (Enter to send) · 输入消息", continuous_update=False,
                       layout=widgets.Layout(width="70%"))
    send, stop = widgets.Button(description="Send", button_style="primary"), widgets.Button(description="Stop")
    readout = widgets.Label("TTFT – · tok/s –")
    stop.disabled = True

    def visible() -> list[dict]:
        return [m for m in session.messages if m["role"] != "system"]

    def show(reply: str, stats: ReplyStats) -> None:  # called from the reply's thread, once per step
        log.value = render_messages(visible(), reply)
        readout.value = stats.readout()

    def run(text: str) -> None:
        try:
            session.send(text, show)
            log.value = render_messages(visible())
        finally:
            send.disabled, box.disabled, stop.disabled = False, False, True

    def on_send(_=None) -> None:
        text = box.value.strip()
        if not text or send.disabled:
            return
        box.value, send.disabled, box.disabled, stop.disabled = "", True, True, False
        log.value = render_messages(visible() + [{"role": "user", "content": text}], "")
        threading.Thread(target=run, args=(text,), daemon=True).start()

    send.on_click(on_send)
    box.observe(on_send, "value")  # with continuous_update=False: on Enter (or leaving the box)
    stop.on_click(lambda _: session.stop())
    widget = widgets.VBox([log, widgets.HBox([box, send, stop]), readout])
    widget.session = session  # for tests and for reading the history
    return widget
