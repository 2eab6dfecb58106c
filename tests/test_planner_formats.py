"""Weight formats in the planner: whole-file sizes against published ones, each with where it was published."""
from __future__ import annotations

import pytest

from course_lib.planner import (FORMATS, LLAMA_31_8B_FILES, WeightFormat, file_bits, find_format, load_config, plan,
                                weight_memory)

GiB = 2 ** 30
QUANTIZE_README = "https://github.com/ggml-org/llama.cpp/blob/master/tools/quantize/README.md"

# Llama-3.1-8B has Llama-3-8B's shapes (the PRESETS entry): the README's table, "size (GiB)" and "bits/weight"
LLAMA_31_8B_GGUF = LLAMA_31_8B_FILES


@pytest.mark.parametrize("name", LLAMA_31_8B_GGUF)
def test_gguf_files_of_llama_3_8b_match_llama_cpps_table(name):
    """Sizes and bits a weight of whole Llama-3.1-8B GGUF files, from QUANTIZE_README's table."""
    gib, bpw = LLAMA_31_8B_GGUF[name]
    cfg = load_config("Llama-3-8B")
    total = weight_memory(cfg, weight_format=name).total
    assert total / GiB == pytest.approx(gib, abs=0.006)
    assert 8 * total / cfg.num_parameters() == pytest.approx(bpw, abs=0.001)
    assert file_bits("Llama-3-8B", name) == pytest.approx(bpw, abs=0.001)


def test_block_bits_are_not_a_whole_files_bits():
    """Q4_0 and Q4_K blocks are both 4.5 bits a weight; a Q4_K_M file is 4.89, wider than Q4_0's own file."""
    assert FORMATS["q4_0"].bits_per_weight == FORMATS["q4_k_m"].bits_per_weight == 4.5
    assert file_bits("Llama-3-8B", "q4_k_m") > file_bits("Llama-3-8B", "q4_0") + 0.2
    assert file_bits("Llama-3-8B", "bf16") == pytest.approx(16, abs=0.01)


def test_llama_3_70b_q4_k_m_is_about_40_gib_not_the_course_int4s_52():
    """QUANTIZE_README: Llama 3.1 70B in Q4_K_M is 43.1 GB (= 40.1 GiB); the course's QuantLinear INT4 is 51.7 GiB."""
    p = plan("Llama-3-70B", "h100", weight_format="q4_k_m", context_len=8192, concurrency=16)
    assert p.weight_bytes / 1e9 == pytest.approx(43.1, rel=0.02)
    assert 39 < p.weight_bytes / GiB < 41 and p.weight_format == "q4_k_m"
    course = plan("Llama-3-70B", "h100", weight_bits=4, context_len=8192, concurrency=16)
    assert course.weight_bytes / GiB == pytest.approx(51.7, abs=0.1) and course.weight_format is None
    assert p.max_concurrency > course.max_concurrency and p.tpot_s < course.tpot_s


def test_bf16_is_two_bytes_a_parameter():
    """meta-llama/Meta-Llama-3-8B's safetensors hold 16.06 GB (8.03B parameters x 2 bytes)."""
    assert weight_memory(load_config("Llama-3-8B"), weight_format="bf16").total / 1e9 == pytest.approx(16.06, abs=0.01)


def test_awq_keeps_embeddings_and_head_in_16_bits():
    """AWQ/GPTQ group-128 layout: 4-bit codes + fp16 scale + 4-bit zero per 128 inputs; embeddings, lm_head fp16."""
    cfg = load_config("Llama-3-8B")
    linear = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    other = 2 * 128256 * 4096 + 65 * 4096  # embeddings, lm_head, norms
    awq = weight_memory(cfg, weight_format="AWQ")
    assert awq.total == int(linear * (4 + 20 / 128) / 8 + 2 * other)  # 5.73 GB
    assert awq.read == awq.total - 2 * 128256 * 4096  # a step gathers a few rows of the embeddings
    assert 8 * awq.per_linear_weight == pytest.approx(4.15625)
    mlx = weight_memory(cfg, weight_format="mlx-4bit")  # mlx-lm quantizes embeddings and lm_head too
    assert mlx.total / 1e9 == pytest.approx(cfg.num_parameters() * 4.5 / 8e9, rel=0.001)


def test_formats_are_cited_and_names_are_forgiving():
    assert {"q4_0", "q4_k_m", "q5_k_m", "q6_k", "q8_0", "awq", "gptq", "mlx-4bit", "fp8", "bf16"} <= set(FORMATS)
    assert all(f.source and f.needs for f in FORMATS.values())
    assert find_format("Q4_K_M") is find_format("q4-k-m") is FORMATS["q4_k_m"]
    assert find_format("float16").name == "fp16" and find_format("awq").head_bits == 16
    assert "8.9" in FORMATS["fp8"].needs
    with pytest.raises(ValueError, match="unknown weight format 'nf4'; choose one of: q4_0, q4_k_m"):
        find_format("nf4")
    with pytest.raises(ValueError, match="mixes"):
        WeightFormat("x", 4, 4, 4, "test", mixes=(("v_proj", 1.5, 6),))


def test_format_and_weight_bits_together_is_an_error_and_the_table_says_which():
    with pytest.raises(ValueError, match="not both"):
        plan("Llama-3-8B", "h100", weight_format="q4_k_m", weight_bits=4)
    title = plan("Llama-3-8B", "l4", weight_format="fp8").table().splitlines()[0]
    assert title.startswith("Llama-3-8B (fp8, 9.05 bits a weight) on L4")
