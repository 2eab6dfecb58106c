"""The notebooks' chat box: streamed replies equal the engine's, Stop aborts and frees, the widget wires it up."""
from __future__ import annotations

import html
import threading
import time

from course_lib import SamplingParams
from course_lib.viz.chat import ChatSession, ReplyStats, chat_widget, default_params, render_messages

GREEDY = SamplingParams(max_tokens=16, temperature=0)


def test_session_streams_the_engines_reply_and_keeps_the_history(llm):
    session = ChatSession(llm, GREEDY)
    updates = []
    reply, stats = session.send("What is the capital of France?", lambda text, s: updates.append(text))
    want = llm.chat([{"role": "user", "content": "What is the capital of France?"}], GREEDY)[0].outputs[0]
    assert reply == want.text and updates[-1] == reply and len(updates) >= 2
    assert stats.tokens == len(want.token_ids) and stats.finish_reason == want.finish_reason
    assert 0 < stats.ttft <= stats.seconds
    assert [m["role"] for m in session.messages] == ["user", "assistant"]
    second, _ = session.send("And of Italy?")  # the template now holds the whole conversation
    assert len(session.messages) == 4 and second == session.messages[-1]["content"]


def test_stop_aborts_the_reply_and_frees_its_blocks(llm):
    session = ChatSession(llm, SamplingParams(max_tokens=300, temperature=0, ignore_eos=True))
    result = {}

    def on_update(text, stats):
        if stats.tokens >= 3:
            session.stop()

    thread = threading.Thread(target=lambda: result.update(out=session.send("Tell me a story.", on_update)))
    thread.start()
    thread.join(timeout=60)
    reply, stats = result["out"]
    assert stats.finish_reason == "stopped" and 3 <= stats.tokens < 300
    assert llm.engine.block_manager.num_used_blocks == 0 and not llm.engine.requests


def test_reply_stats_readout():
    stats = ReplyStats(tokens=11, ttft=0.2, seconds=1.2, finish_reason="length")
    assert stats.tokens_per_s == 10.0
    assert stats.readout() == "TTFT 200 ms · 10.0 tok/s · 11 tokens · length"
    assert ReplyStats().tokens_per_s is None and ReplyStats().readout().startswith("TTFT –")


def test_session_and_widget_share_one_default():
    llm = object()  # neither touches the model before the first message
    widget = chat_widget(llm, system="Be brief.")
    assert ChatSession(llm).params == widget.session.params == default_params()
    assert ChatSession(llm).params is not ChatSession(llm).params  # each session may change its own
    assert widget.session.messages == [{"role": "system", "content": "Be brief."}]


def test_render_escapes_text():
    page = render_messages([{"role": "user", "content": "<b>hi</b> 你好"}], pending="x")
    assert "&lt;b&gt;hi&lt;/b&gt; 你好" in page and "x ▌" in page


def test_widget_sends_on_enter_and_shows_the_reply(llm):
    widget = chat_widget(llm, GREEDY)
    log, (box, send, stop), readout = widget.children[0], widget.children[1].children, widget.children[2]
    box.value = "Say hello."  # what pressing Enter does with continuous_update=False
    deadline = time.monotonic() + 60
    while (send.disabled or len(widget.session.messages) < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not send.disabled and stop.disabled and box.value == ""
    reply = widget.session.messages[-1]["content"]
    assert reply and html.escape(reply) in log.value and "TTFT" in readout.value
