"""The learner's path on a machine that is not Linux, played on Linux: no /proc/cpuinfo, no fcntl, no compiler, and
an ASCII default encoding for files and stdout (as a Windows pipe or a bare console may have). The chapters' set-up,
a Chinese chat and LLM(accel=True)'s fallback must give the same tokens as here, with one warning at most. And a
scan of course_lib for what would break elsewhere: text files without an explicit encoding, processes started by
fork, signals Windows lacks.
"""
from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "course_lib"
CHAT = [{"role": "user", "content": "你好，请用一句话介绍你自己。"}]
MAX_TOKENS = 8

# Run in a child process whose interpreter cannot see the Linux-only facilities.
ELSEWHERE = r'''
import builtins, io, json, locale, os, sys, warnings
sys.modules["fcntl"] = None  # `import fcntl` raises ImportError, as on Windows
_open, _stat = io.open, os.stat
def _hidden(path):
    return os.fspath(path) == "/proc/cpuinfo" if isinstance(path, (str, os.PathLike)) else False
def _no_cpuinfo_open(file, *args, **kwargs):
    if _hidden(file):
        raise FileNotFoundError(2, "No such file or directory", str(file))
    return _open(file, *args, **kwargs)
def _no_cpuinfo_stat(path, *args, **kwargs):
    if _hidden(path):
        raise FileNotFoundError(2, "No such file or directory", str(path))
    return _stat(path, *args, **kwargs)
builtins.open = io.open = _no_cpuinfo_open
os.stat = _no_cpuinfo_stat

warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    from course_lib import LLM, SamplingParams, host
    from course_lib.chapter import setup_chapter
    setup = setup_chapter()  # prints "Machine: ... · ..." to an ASCII stdout
    params = SamplingParams(max_tokens=%d, temperature=0.0)
    chat = json.loads(%r)
    reference = LLM(device="cpu").chat(chat, params)[0].outputs[0]
    accel = LLM(device="cpu", accel=True).chat(chat, params)[0].outputs[0]
    host.echo(reference.text)  # Chinese on an ASCII stdout: question marks, not UnicodeEncodeError
print(json.dumps({
    "reference": reference.token_ids, "accel": accel.token_ids, "cpu_model": host.cpu_model(),
    "vendor": host.cpu_vendor(), "file_encoding": locale.getpreferredencoding(False),
    "stdout_encoding": sys.stdout.encoding,
    "warnings": [str(w.message) for w in caught if "course_lib" in str(w.message) or "accel" in str(w.message)],
}))
''' % (MAX_TOKENS, json.dumps(CHAT))


@pytest.mark.slow
def test_learner_path_without_linux_facilities(llm, tmp_path):
    from course_lib import SamplingParams

    empty = tmp_path / "bin"
    empty.mkdir()  # PATH: no c++, no ninja, nothing
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "PYTHONUTF8", "PYTHONIOENCODING"))}
    env.update(PATH=str(empty), LANG="C", LC_ALL="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0",
               PYTHONIOENCODING="ascii:strict", PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    script = tmp_path / "elsewhere.py"  # a file: Python reads source as UTF-8 whatever the locale
    script.write_text(ELSEWHERE, encoding="utf-8")
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, timeout=600)
    stdout = out.stdout.decode("ascii")  # every byte ASCII, or this raises
    assert out.returncode == 0, stdout + out.stderr.decode("utf-8", "replace")
    report = json.loads(stdout.splitlines()[-1])
    assert "utf" not in report["file_encoding"].lower() and report["stdout_encoding"] == "ascii"
    assert report["vendor"] is None and report["cpu_model"]  # from platform, not /proc/cpuinfo
    assert "Machine: " in stdout and "?" in stdout  # the "·" became "?"
    here = llm.chat(CHAT, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))[0].outputs[0].token_ids
    assert report["reference"] == here and report["accel"] == here
    assert len(report["warnings"]) <= 1, report["warnings"]
    assert all("compiler" in w or "c++" in w or "built" in w for w in report["warnings"])


@pytest.mark.parametrize("encoding", ["ascii", "cp1252"])
def test_setup_chapter_prints_to_any_console(encoding):
    from course_lib.chapter import setup_chapter
    from course_lib.host import echo

    raw = io.BytesIO()
    console = io.TextIOWrapper(raw, encoding=encoding, errors="strict", write_through=True)
    with contextlib.redirect_stdout(console):
        setup_chapter(device="cpu")
        echo("你好 ✓")
    shown = raw.getvalue().decode(encoding)
    assert shown.startswith("Machine: ") and "?" in shown.splitlines()[-1]


def test_cpu_questions_without_proc(monkeypatch, tmp_path):
    from course_lib import host
    from course_lib.accel import build
    from course_lib.chapter import processor_name

    here = build.cpu_tag()
    monkeypatch.setattr(host, "CPUINFO", tmp_path / "no-cpuinfo")
    assert host.cpu_vendor() is None and host.cpu_model() and host.cpu_features()
    assert processor_name(__import__("torch").device("cpu")) == host.cpu_model()
    assert len(build.cpu_tag()) == 10 and (build.cpu_tag() != here or not Path("/proc/cpuinfo").exists())


def test_build_lock_without_fcntl(monkeypatch, tmp_path):
    from course_lib.accel.build import build_lock

    monkeypatch.setitem(sys.modules, "fcntl", None)
    with build_lock(tmp_path / "build"):
        pass  # PyTorch's own lock file only


def calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            yield name, node


def sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(ROOT), ast.parse(path.read_text(encoding="utf-8"))


def text_mode(node: ast.Call) -> bool:
    """Whether an open() call opens text (no "b" in a literal mode)."""
    mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
    return not (isinstance(mode, ast.Constant) and "b" in str(mode.value))


def test_text_files_name_their_encoding():
    """Windows reads and writes text in its ANSI code page unless told: every text file in course_lib says UTF-8."""
    missing = []
    for path, tree in sources():
        for name, node in calls(tree):
            named = any(k.arg == "encoding" for k in node.keywords)
            if name in ("read_text", "write_text") and not named:
                missing.append(f"{path}:{node.lineno} {name}")
            elif name == "open" and isinstance(node.func, ast.Name) and text_mode(node) and not named:
                missing.append(f"{path}:{node.lineno} open")
    assert not missing, missing


def test_processes_spawn_and_signals_exist_everywhere():
    """fork is POSIX only (and unsafe with threads): every process course_lib starts is spawned. Windows has only
    SIGINT, SIGTERM, SIGABRT, SIGFPE, SIGILL, SIGSEGV and SIGBREAK."""
    windows_signals = {"SIGINT", "SIGTERM", "SIGABRT", "SIGFPE", "SIGILL", "SIGSEGV", "SIGBREAK", "SIG_IGN", "SIG_DFL"}
    problems = []
    for path, tree in sources():
        for name, node in calls(tree):
            if name in ("get_context", "set_start_method") and not (
                    node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == "spawn"):
                problems.append(f"{path}:{node.lineno} {name} without 'spawn'")
            if name in ("fork", "forkpty", "killpg", "setsid", "getuid"):
                problems.append(f"{path}:{node.lineno} os.{name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "signal" \
                    and node.attr.startswith("SIG") and node.attr not in windows_signals:
                problems.append(f"{path}:{node.lineno} signal.{node.attr}")
    assert not problems, problems


def test_a_server_process_is_stopped_the_way_its_os_allows():
    """Chapters 10 and 11 stop their server as Ctrl-C would: SIGINT here; Windows can send no SIGINT to another
    process, so there the server starts in its own process group and gets Ctrl-Break, which it handles too."""
    import signal

    from course_lib.serve import SERVER_PROCESS_OPTIONS, stop_gracefully

    class Process:
        sent: list = []

        def send_signal(self, sig):
            self.sent.append(sig)

    stop_gracefully(Process())
    assert Process.sent == [signal.SIGINT] and SERVER_PROCESS_OPTIONS == {}
    source = (PACKAGE / "serve" / "__main__.py").read_text(encoding="utf-8")
    assert '"SIGBREAK"' in source
