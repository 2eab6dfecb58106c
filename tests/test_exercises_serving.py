"""Chapter 10's checker: True on a reference solution, False on plausible mistakes and on an untouched stub."""
import json

from course_lib.exercises import check_sse_text
from course_lib.exercises.serving import CHAT, COMPLETION, reference_sse_text


def sse_text(lines):
    text = []
    for line in lines:
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            break
        for choice in json.loads(line[6:])["choices"]:
            text.append(choice.get("text") or choice.get("delta", {}).get("content") or "")
    return "".join(text)


def test_reference_solution_passes(capsys):
    assert check_sse_text(sse_text)
    assert check_sse_text(sse_text, lines=CHAT, want="你好, world")
    assert "4/4 checks passed" in capsys.readouterr().out
    assert reference_sse_text(COMPLETION) == "The end"


def test_mistakes_fail(capsys):
    def ignores_done(lines):  # reads past [DONE]
        return "".join(c.get("text") or c.get("delta", {}).get("content") or ""
                       for line in lines if line.startswith("data: {") for c in json.loads(line[6:])["choices"])

    def chat_only(lines):  # completions streams carry "text", not "delta"
        return "".join(c["delta"].get("content", "") for line in lines if line.startswith("data: {")
                       for c in json.loads(line[6:])["choices"])

    assert not check_sse_text(ignores_done)
    assert not check_sse_text(chat_only)
    assert "✗" in capsys.readouterr().out


def test_stub_is_not_attempted(capsys):
    def stub(lines):
        raise NotImplementedError

    assert not check_sse_text(stub)
    assert "not attempted" in capsys.readouterr().out
