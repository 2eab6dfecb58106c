"""`make bench-peers` and the finder of llama.cpp's binaries, without building llama.cpp (minutes)."""
import io
import os
import tarfile

import pytest

from benchmarks import peers
from course_lib.viz import engines


def test_the_build_and_the_finder_agree_on_where_the_binaries_are():
    assert peers.BUILD == engines.LLAMA_CPP_BUILD and peers.ENV_VAR == engines.LLAMA_CPP_BIN


def test_the_finder_takes_the_folder_named_by_the_environment_first(tmp_path, monkeypatch):
    exe = tmp_path / ("llama-bench.exe" if os.name == "nt" else "llama-bench")
    exe.write_text("")
    monkeypatch.setenv("LLAMA_CPP_BIN", str(tmp_path))
    assert peers.binary("llama-bench") == exe
    monkeypatch.delenv("LLAMA_CPP_BIN")
    monkeypatch.setattr(engines, "LLAMA_CPP_BUILD", tmp_path / "none")
    monkeypatch.setenv("PATH", "")
    assert peers.binary("llama-bench") is None
    assert "make bench-peers" in peers.missing()


@pytest.mark.parametrize("flags, repack", [("avx2 avx512f", True), ("avx512f amx_tile amx_int8", False)])
def test_llama_server_runs_the_course_file_with_its_port_and_slots(monkeypatch, flags, repack):
    monkeypatch.setattr(engines, "cpu_features", lambda: flags)
    command = engines.llama_server_command("llama-server", 8123, parallel=16, threads=2)
    args = dict(zip(command[1::2], command[2::2]))
    assert args["--port"] == "8123" and args["--parallel"] == "16" and args["--threads"] == "2"
    assert args["--model"].endswith(".gguf")
    assert ("--no-repack" not in command) == repack  # AMX's repacked Q4_1 crashed on multi-token batches


def _sdist(path, names):
    with tarfile.open(path, "w:gz") as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"x\n"))
    return path


def test_only_the_vendored_llama_cpp_is_unpacked(tmp_path):
    archive = _sdist(tmp_path / "p-1.0.tar.gz", ["p-1.0/setup.py", "p-1.0/vendor/llama.cpp/CMakeLists.txt",
                                                  "p-1.0/vendor/llama.cpp/src/llama.cpp"])
    assert peers.vendored_commit(archive) is None  # no submodule HEAD in this sdist
    src = peers.extract(archive, tmp_path / "out")
    assert (src / "CMakeLists.txt").is_file() and (src / "src" / "llama.cpp").is_file()
    assert not (tmp_path / "out" / "p-1.0" / "setup.py").exists()
    with pytest.raises(SystemExit, match="vendors llama.cpp"):
        peers.extract(_sdist(tmp_path / "q-1.0.tar.gz", ["q-1.0/setup.py"]), tmp_path / "out2")
