"""Chapter 11: the decision table's data, and the checkers: True on reference solutions, False on mistakes."""
import pytest

from course_lib.exercises import check_best_format, check_itl_and_tpot, check_table_cell
from course_lib.exercises.choosing import REQUESTS, reference_best_format, reference_itl_and_tpot, reference_table_cell
from course_lib.planner import FORMATS
import re

from course_lib.planner.engines import (DECISIONS, ENGINES, FACTORS, HARDWARE, USERS, VENDORS, decide, decision_table,
                                        placed_engines)


def test_every_cell_names_a_known_engine_and_every_engine_is_placed():
    assert set(DECISIONS) == {(h, u) for h in HARDWARE for u in USERS}
    for choice in DECISIONS.values():
        assert {choice.engine, *choice.also} <= set(ENGINES)
    active = {name for name, e in ENGINES.items() if e.status == "active"}
    assert placed_engines() == active  # TGI, in maintenance mode, is the one left out
    assert "maintenance" in ENGINES["TGI"].status
    assert decision_table().shape == (len(HARDWARE), len(USERS))
    with pytest.raises(ValueError, match="hardware"):
        decide("a phone", "one")


def test_no_vllm_where_it_does_not_run_and_the_table_says_when_hardware_is_not_enough():
    """vLLM runs on Linux (and WSL), not natively on macOS or Windows: no vLLM cell on a laptop CPU or a Mac."""
    for hardware in ("laptop CPU", "Apple silicon"):
        for users in USERS:
            c = decide(hardware, users)
            assert "vLLM" not in (c.engine, *c.also), (hardware, users)
        many = decide(hardware, "many")
        assert not many.enough and "--parallel" in many.lesson and "Linux" in many.lesson
        assert decision_table().loc[hardware, "many"].endswith("(not enough)")
    assert all(c.enough for (h, _), c in DECISIONS.items() if h not in ("laptop CPU", "Apple silicon"))
    assert "Linux" in ENGINES["vLLM"].runs_on


def test_several_gpus_split_by_their_link_as_chapter_13_says():
    """Over PCIe: one copy a card (data parallel) or pipeline parallel; over NVLink: tensor parallel."""
    assert {"several GPUs over PCIe", "several GPUs over NVLink"} <= set(HARDWARE)
    for users in USERS:
        pcie, nvlink = decide("several GPUs over PCIe", users), decide("several GPUs over NVLink", users)
        assert "tensor-parallel" not in pcie.lesson and re.search(r"data-parallel|pipeline|split-mode layer",
                                                                  pcie.lesson), users
        assert "tensor parallel" in nvlink.lesson or "tensor-parallel" in nvlink.lesson, users
    assert decide("several GPUs over PCIe", "many").engine != "TensorRT-LLM"


def test_sglang_is_argued_on_what_vllm_lacks_and_the_factors_and_vendors_are_there():
    sglang = decide("one data-centre GPU", "many")
    assert sglang.engine == "SGLang" and "scheduling" in sglang.lesson and "structured" in sglang.lesson
    factors = {name: (what, source) for name, what, source in FACTORS}
    moe = factors["mixture of experts (MoE)"][0]
    assert "--n-cpu-moe" in moe and "active" in moe
    assert "--kv-cache-dtype fp8" in factors["KV-cache quantization"][0] and "context length" in factors
    assert all(source for _, source in factors.values())
    assert [v.split()[0] for v in VENDORS] == ["AMD", "Intel", "Huawei"]
    assert "ROCm" in VENDORS["AMD (Instinct, Radeon)"][0] and "vLLM-Ascend" in VENDORS["Huawei Ascend (NPU)"][0]


def test_every_llama_server_command_passes_its_port():
    """llama-server's default port is changing: every command the course prints passes --port."""
    texts = [ENGINES["llama.cpp"].start] + [c.lesson for c in DECISIONS.values()] + [w for _, w, _ in FACTORS]
    commands = [m for t in texts for m in re.findall(r"llama-server[^;:,)]*", t)]
    assert commands and all("--port" in cmd for cmd in commands if " -" in cmd), commands


def test_formats_in_the_table_are_planner_formats():
    assert {c.weight_format for c in DECISIONS.values()} <= set(FORMATS)


def test_itl_and_tpot_reference_passes_and_mistakes_fail(capsys):
    assert check_itl_and_tpot(reference_itl_and_tpot)

    def per_chunk_tpot(requests):  # divides by chunks, not tokens: wrong where a chunk holds two tokens
        itl, _ = reference_itl_and_tpot(requests)
        return itl, reference_itl_and_tpot([(t, len(t)) for t, _ in requests])[1]

    def itl_per_request(requests):  # averages each request's mean gap: every request one vote, like TPOT
        means = [(t[-1] - t[0]) / (len(t) - 1) for t, _ in requests]
        return sum(means) / len(means), reference_itl_and_tpot(requests)[1]

    assert not check_itl_and_tpot(per_chunk_tpot)
    assert not check_itl_and_tpot(itl_per_request)
    itl, tpot = reference_itl_and_tpot(REQUESTS)
    assert itl != pytest.approx(tpot)
    assert "✗" in capsys.readouterr().out


def test_table_cell_reference_passes_and_mistakes_fail(capsys):
    assert check_table_cell(reference_table_cell)

    def gpu_first(situation):  # ignores Apple silicon
        hardware, users = reference_table_cell({**situation, "apple_silicon": False})
        return hardware, users

    assert not check_table_cell(gpu_first)

    def any_link(situation):  # several GPUs as one kind, whatever links them
        hardware, users = reference_table_cell({**situation, "nvlink": True})
        return hardware, users

    assert not check_table_cell(any_link)
    assert not check_table_cell(lambda s: ("a laptop", "one"))
    assert "✗" in capsys.readouterr().out


def test_stubs_are_not_attempted(capsys):
    def stub(*args):
        raise NotImplementedError

    assert not check_itl_and_tpot(stub)
    assert not check_table_cell(stub)
    assert "not attempted" in capsys.readouterr().out


def test_best_format_reference_passes_and_mistakes_fail(capsys):
    assert check_best_format(reference_best_format)
    assert not check_best_format(lambda *args: "q4_k_m")  # always the smallest common answer
    assert not check_best_format(lambda m, d, u, c: reference_best_format(m, d, 1, c))  # forgets the users' KV
    assert "✗" in capsys.readouterr().out
