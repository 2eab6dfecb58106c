"""The CPU's packed linear layers (`course_lib.packed_linear`) against F.linear and the unpacked model."""
from __future__ import annotations

import copy
import gc

import pytest
import torch

from course_lib import LLM, SamplingParams
from course_lib import packed_linear
from course_lib.cpp_build import cpuinfo, load_cpu_extension, toolchain_available
from course_lib.fast_path import use_fast_path
from course_lib.packed_linear import (GEMV_SOURCE, ONEDNN_PANEL_ROWS, SGEMM_SOURCE, AmxLinear, FewRowsLinear,
                                      OneRowLinear, PackedLinear, SgemmPackedLinear, amx_kernel, can_pack,
                                      float32_kernel, gemv_kernel, has_panel_kernel, one_row_kernel_pays,
                                      onednn_kernel, pack_linears, sgemm_kernel)
from course_lib.profiling.memory import weight_bytes
from course_lib.profiling.roofline import weights_read

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # see conftest.py

needs_bf16_packing = pytest.mark.skipif(not can_pack("cpu", torch.bfloat16),
                                        reason="this CPU's oneDNN has no bfloat16 kernels")


@needs_bf16_packing
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_linear(bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96, bias=bias).to(torch.bfloat16)
    packed = PackedLinear(linear)
    for shape in [(1, 64), (16, 64), (2, 5, 64), (0, 64)]:  # one row, a batch, [batch, seq, hidden], no rows
        x = torch.randn(shape, dtype=torch.bfloat16)
        torch.testing.assert_close(packed(x), linear(x), rtol=1e-2, atol=1e-2)  # within bfloat16 rounding
    assert "packed_weight" not in packed.state_dict()  # opaque: never saved


def test_pack_linears_only_in_half_precision_on_the_cpu(tiny):
    model = use_fast_path(tiny())  # float64: left alone
    assert pack_linears(model) is model and type(model.lm_head) is torch.nn.Linear
    assert all(type(m) is not FewRowsLinear for m in model.modules())
    assert not can_pack("cpu", torch.float32) and not can_pack("meta", torch.bfloat16)


@pytest.mark.parametrize("bias", [False, True])
def test_few_rows_linear_matches_linear(bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96, bias=bias)
    few = copy.deepcopy(linear)
    few.__class__ = FewRowsLinear
    for shape in [(1, 64), (4, 64), (8, 64), (1, 16, 64), (2, 24, 64), (48, 64), (49, 64), (0, 64)]:
        x = torch.randn(shape)
        got = few(x)
        assert got.shape == linear(x).shape and got.is_contiguous()
        torch.testing.assert_close(got, linear(x), rtol=1e-5, atol=1e-5)  # float32 rounding, another order


def test_float32_layers_become_few_rows_linear_sharing_their_weights(monkeypatch, tiny):
    monkeypatch.setattr(packed_linear, "cpu_vendor", lambda: "GenuineIntel")  # where MKL is fast...
    monkeypatch.setattr(packed_linear, "sgemm_kernel", lambda: None)  # ...but its packed GEMM does not build
    model = use_fast_path(tiny()).float()
    weights = {name: m.weight for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    ids = torch.randint(0, 97, (1, 20))  # 20 rows: the W @ x^T branch
    want = model(ids)
    pack_linears(model)
    assert type(model.lm_head) is torch.nn.Linear  # project_to_vocab already computes it as W @ x^T
    layers = {n: m for n, m in model.named_modules() if isinstance(m, FewRowsLinear)}  # qkv, o, gate_up, down
    assert len(layers) == 4 * 3 and all(m.weight is weights[n] for n, m in layers.items())
    torch.testing.assert_close(model(ids), want, rtol=1e-5, atol=1e-5)


def needs_sgemm():
    """Skip where this torch has no MKL; fail where it has and the packed GEMM does not build."""
    if not (toolchain_available() and torch.backends.mkl.is_available()):
        pytest.skip("no C++ toolchain or no MKL in this torch: float32 keeps FewRowsLinear")
    assert load_cpu_extension("sgemm_packed", SGEMM_SOURCE) is not None


def panel_bytes(model: torch.nn.Module) -> int:
    """Bytes of the panels layers hold beside MKL's or oneDNN's packing (float32; bfloat16 where not Intel)."""
    return sum(m.panels.nbytes for m in model.modules() if getattr(m, "panels", None) is not None)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("features", [(64, 96), (37, 80), (64, 90)])  # (in, out): 6 panels, 5 panels, none
def test_sgemm_packed_linear_matches_linear(bias, features):
    needs_sgemm()
    torch.manual_seed(0)
    linear = torch.nn.Linear(*features, bias=bias)
    packed = SgemmPackedLinear(linear)
    kernel = sgemm_kernel()
    has_panels = kernel.has_panels and features[1] % 16 == 0
    assert (packed.panels is not None) == has_panels
    # counted at the weight's size, not MKL's reservation; the panels are the weight again
    assert weight_bytes(packed) == weight_bytes(linear) + (linear.weight.nbytes if has_panels else 0)
    # rows on both sides of the panels' limit: 1 to 4 take 4 panels a task, more 2; one packing serves any rows
    limit = kernel.panel_rows
    for rows in [(1,), (3,), (1, 16), (5,), (13,), (limit,), (limit + 1,), (2, 40), (0,), (300,)]:
        x = torch.randn(*rows, features[0])
        got = packed(x)
        assert got.shape == linear(x).shape and got.is_contiguous()
        torch.testing.assert_close(got, linear(x), rtol=1e-5, atol=1e-5)
    if has_panels:  # the panels and MKL's packing alike, called directly: both paths are taken, not one twice
        x = torch.randn(7, features[0])
        by_panels = kernel.linear(x, packed.packed_weight, packed.panels, features[1])
        by_mkl = kernel.linear(x, packed.packed_weight, None, features[1])
        torch.testing.assert_close(by_panels, by_mkl, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(by_panels, x @ linear.weight.detach().T, rtol=1e-5, atol=1e-5)
    if bias:
        return  # compiled once per shape (a compile takes seconds)
    f = torch.compile(packed, dynamic=True, fullgraph=True)  # the operator course_lib::sgemm_linear traces
    with torch.inference_mode():
        for rows in [1, 5, 7, 40]:
            x = torch.randn(rows, features[0])
            torch.testing.assert_close(f(x), linear(x), rtol=1e-5, atol=1e-5)


def test_sgemm_panels_are_the_weight_cut_into_blocks_of_16_outputs():
    needs_sgemm()
    # built with -march=native: a CPU with AVX-512 gets the panel kernel (else the tests above check MKL alone)
    assert sgemm_kernel().has_panels == ("avx512f" in (cpuinfo("flags") or "").split())
    w = torch.arange(32 * 3, dtype=torch.float32).view(32, 3)  # [out, in]
    panels = sgemm_kernel().pack_panels(w)
    assert panels.shape == (2, 3, 16)
    assert panels[1, 2, 5] == w[16 + 5, 2] and panels[0, 0, 15] == w[15, 0]
    with pytest.raises(RuntimeError, match="n % 16"):
        sgemm_kernel().pack_panels(torch.zeros(20, 3))


def test_sgemm_by_panels_at_any_rows_as_the_benchmark_calls_it():
    needs_sgemm()
    kernel = sgemm_kernel()
    if not kernel.has_panels:
        pytest.skip("built without AVX-512: no panel kernel")
    torch.manual_seed(0)
    w = torch.randn(80, 40)
    panels = kernel.pack_panels(w)
    for rows in [0, 1, 4, 12, 13, 64, 100]:  # beyond the engine's limit too; 13 rows in two blocks of 7 and 6
        x = torch.randn(rows, 40)
        torch.testing.assert_close(kernel.by_panels(x, panels), x @ w.T, rtol=1e-5, atol=1e-5)
    x = torch.randn(40, 6).T  # not contiguous
    torch.testing.assert_close(kernel.by_panels(x, panels), x @ w.T, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="panels"):
        kernel.by_panels(torch.randn(3, 41), panels)  # k does not match
    with pytest.raises(RuntimeError, match="panels"):
        kernel.by_panels(torch.randn(3, 40), w)  # a plain weight, not panels


def test_float32_layers_become_sgemm_packed_the_lm_head_included(monkeypatch, tiny):
    needs_sgemm()
    monkeypatch.setattr(packed_linear, "cpu_vendor", lambda: "GenuineIntel")
    model = use_fast_path(tiny()).float()
    ids = torch.randint(0, 97, (1, 20))
    want, size = model(ids), weight_bytes(model)
    pack_linears(model)
    layers = [m for m in model.modules() if isinstance(m, SgemmPackedLinear)]
    assert len(layers) == 4 * 3 + 1 and isinstance(model.lm_head, SgemmPackedLinear)
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    # the packed weights replace the plain ones (this lm_head is untied); the panels are held beside them
    assert weight_bytes(model) == size + panel_bytes(model)
    assert weights_read(model) == size - model.embed_tokens.weight.nbytes  # a step reads one of the two
    torch.testing.assert_close(model(ids), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model(ids[:, :1]), want[:, :1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vendor", ["GenuineIntel", "AuthenticAMD"])  # MKL's packed GEMM, oneDNN
def test_a_packed_tied_lm_head_holds_a_copy_and_a_step_reads_one_table(monkeypatch, vendor, tiny):
    needs_sgemm() if vendor == "GenuineIntel" else needs_onednn()
    monkeypatch.setattr(packed_linear, "cpu_vendor", lambda: vendor)
    model = use_fast_path(tiny()).float()
    model.lm_head.weight = model.embed_tokens.weight  # tied, as SmolLM2's
    table = model.embed_tokens.weight.numel() * 4
    held, read = weight_bytes(model), weights_read(model)
    assert read == held  # the head multiplies by the table itself
    pack_linears(model)
    # the packed head is a copy; the embedding keeps the table
    assert weight_bytes(model) == held + table + panel_bytes(model)
    assert weights_read(model) == read  # a step reads the copy and gathers rows of the table


def test_float32_engine_batch_of_few_rows_keeps_greedy_tokens(llm):
    fast = LLM(device="cpu", fast_path=True)
    kind = {"onednn": PackedLinear, "mkl": SgemmPackedLinear, "few_rows": FewRowsLinear}[float32_kernel()]
    assert isinstance(fast.model.layers[0].mlp.down_proj, kind)
    prompts = [f"Count from {i}: {i}," for i in range(10)]  # 10 decode rows a step
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert [o.outputs[0].token_ids for o in fast.generate(prompts, params)] == want


def needs_onednn():
    """Skip where this torch has no oneDNN or no toolchain is here; fail where the handle table does not build."""
    if not (toolchain_available() and torch.backends.mkldnn.is_available()):
        pytest.skip("no C++ toolchain or no oneDNN in this torch")
    assert onednn_kernel() is not None


@pytest.mark.parametrize("bias", [False, True])
def test_float32_packed_linear_matches_linear_eager_and_compiled(bias):
    needs_onednn()
    kernel = onednn_kernel()
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96, bias=bias)
    kept = kernel.kept()
    eager = PackedLinear(linear)  # eager only: no handle, nothing in the table
    assert eager.handle is None and kernel.kept() == kept
    packed = PackedLinear(linear, for_graph=True)
    assert kernel.kept() == kept + 1 and weight_bytes(packed) == weight_bytes(linear)
    for shape in [(1, 64), (3, 64), (1, 16, 64), (2, 40, 64), (300, 64)]:
        x = torch.randn(shape)
        torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
    f = torch.compile(packed, dynamic=True, fullgraph=True)  # the graph names the weight by its handle
    with torch.inference_mode():
        for shape in [(1, 64), (5, 64), (2, 7, 64)]:
            x = torch.randn(shape)
            torch.testing.assert_close(f(x), linear(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(Exception, match="for_graph=True"):  # an eager-only layer refuses to be traced
        with torch.inference_mode():
            torch.compile(eager, dynamic=True, fullgraph=True)(torch.randn(3, 64))
    other = PackedLinear(linear, for_graph=True)
    assert kernel.kept() == kept + 2
    handle = other.handle
    del other
    gc.collect()
    assert kernel.kept() == kept + 1  # a freed layer's weight leaves the table
    with pytest.raises(RuntimeError, match="freed"):
        torch.ops.course_lib.onednn_linear(torch.randn(2, 64), handle, 96)


def test_float32_packed_linear_sends_a_few_rows_to_the_panels_eager_and_compiled():
    needs_onednn()
    if not has_panel_kernel():
        pytest.skip("no AVX-512 panel kernel here")
    torch.manual_seed(0)
    linear = torch.nn.Linear(576, 96)  # k = 576: oneDNN's sums and the panels' round apart (k = 64: they do not)
    packed, plain = PackedLinear(linear, for_graph=True, panels=True), PackedLinear(linear)
    assert weight_bytes(packed) == weight_bytes(linear) + linear.weight.nbytes  # the panels: the weight again
    f = torch.compile(packed, dynamic=True, fullgraph=True)  # one graph; the operator chooses as it runs
    limit = ONEDNN_PANEL_ROWS
    with torch.inference_mode():
        for rows in [1, 2, 5, limit, limit + 1, 300]:
            x = torch.randn(rows, 576)
            panels = sgemm_kernel().by_panels(x, packed.panels) + linear.bias
            onednn = plain(x)
            assert not torch.equal(panels, onednn), rows  # the paths round apart, so the check below can tell them
            want = panels if rows <= limit else onednn
            assert torch.equal(packed(x), want) and torch.equal(f(x), want), rows
            torch.testing.assert_close(want, linear(x), rtol=1e-5, atol=1e-5)
        assert packed(torch.randn(3, 4, 576)).shape == (3, 4, 96)


def test_float32_model_packed_for_onednn_compiles(monkeypatch, tiny):
    needs_onednn()
    monkeypatch.setattr(packed_linear, "cpu_vendor", lambda: "AuthenticAMD")  # where MKL takes slow code
    model = use_fast_path(tiny()).float()
    ids = torch.randint(0, 97, (1, 20))
    want = model(ids)
    pack_linears(model, opaque=False)  # for torch.compile
    assert sum(isinstance(m, PackedLinear) for m in model.modules()) == 4 * 3 + 1
    assert isinstance(model.lm_head, PackedLinear) and not any(type(m) is torch.nn.Linear for m in model.modules())
    torch.testing.assert_close(model(ids), want, rtol=1e-5, atol=1e-5)
    compiled = torch.compile(model, dynamic=True, fullgraph=True)
    with torch.inference_mode():
        torch.testing.assert_close(compiled(ids), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(compiled(ids[:, :7]), want[:, :7], rtol=1e-5, atol=1e-5)


@needs_bf16_packing
def test_packed_model_matches_fused_model(tiny):
    fused = use_fast_path(tiny()).to(torch.bfloat16)
    packed = pack_linears(copy.deepcopy(fused))
    linears = [m for m in packed.modules() if isinstance(m, torch.nn.Linear)]
    assert linears == [] and isinstance(packed.lm_head, PackedLinear)
    kept = packed.lm_head.weight is not None  # bfloat16 with the one-row kernel: plain weights kept as well
    plain = sum(m.weight.numel() * 2 for m in fused.modules() if isinstance(m, torch.nn.Linear))
    # lm_head is untied here; on CPUs not made by Intel, layers with panels hold those too (tests/test_bf16_panels.py)
    assert weight_bytes(packed) == weight_bytes(fused) + kept * plain + panel_bytes(packed)
    ids = torch.randint(0, 97, (2, 17))
    torch.testing.assert_close(packed(ids), fused(ids), rtol=1.6e-2, atol=1e-3)  # bfloat16 rounding (0.0 here)


@needs_bf16_packing
def test_bfloat16_engine_packs_and_keeps_its_greedy_tokens():
    from course_lib.loading import load_model

    fast = LLM(device="cpu", dtype="bfloat16", fast_path=True)
    assert isinstance(fast.model.lm_head, AmxLinear if amx_kernel() is not None else PackedLinear)
    # the same fused model and decode kernel, only not packed
    unpacked = LLM.from_model(use_fast_path(load_model(device="cpu", dtype=torch.bfloat16)), fast.tokenizer,
                              cpp_decode_attention=fast.engine.model_runner.use_cpp)
    prompts = ["The capital of France is", "1, 2, 3, 4,"]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in unpacked.generate(prompts, params)]
    assert [o.outputs[0].token_ids for o in fast.generate(prompts, params)] == want


def needs_gemv():
    """Skip where the one-row kernel does not run (no AVX512-BF16); fail where it does not build."""
    assert load_cpu_extension("gemv_cpu", GEMV_SOURCE) is not None  # a toolchain is here: it must build
    if gemv_kernel() is None:
        pytest.skip("this CPU has no AVX512-BF16: the engine keeps oneDNN for one row")


@pytest.mark.needs_cpp
def test_gemv_kernel_matches_linear():
    needs_gemv()
    kernel = gemv_kernel()
    torch.manual_seed(0)
    for n, k in [(96, 64), (7, 64), (5, 100), (3, 1536), (1, 32), (6, 48)]:  # n % 4 != 0, k % 32 != 0
        w, x = torch.randn(n, k, dtype=torch.bfloat16), torch.randn(1, k, dtype=torch.bfloat16)
        got, want = kernel.gemv(x, w), torch.nn.functional.linear(x.float(), w.float())
        assert got.dtype == torch.bfloat16 and got.shape == (1, n)
        torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2 * want.abs().max().item())
    with pytest.raises(RuntimeError, match="x \\[1, k\\]"):
        kernel.gemv(torch.randn(2, 64, dtype=torch.bfloat16), torch.randn(8, 64, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="bfloat16 only"):
        kernel.gemv(torch.randn(1, 64), torch.randn(8, 64))


@pytest.mark.needs_cpp
@needs_bf16_packing
@pytest.mark.parametrize("bias", [False, True])
def test_one_row_layers_match_their_packed_and_plain_twins(bias):
    needs_gemv()
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96, bias=bias).to(torch.bfloat16)
    packed, keeping = PackedLinear(linear), PackedLinear(linear, keep_weight=True)
    one_row = copy.deepcopy(linear)
    one_row.__class__ = OneRowLinear
    for shape in [(1, 64), (1, 1, 64), (5, 64), (2, 3, 64)]:  # one row (the kernel), then more rows
        x = torch.randn(shape, dtype=torch.bfloat16)
        for layer in (keeping, one_row):
            torch.testing.assert_close(layer(x), packed(x), rtol=1.6e-2, atol=1e-2)
    f = torch.compile(one_row, dynamic=True, fullgraph=True)  # the operator traces, one row and many
    with torch.inference_mode():
        for shape in [(1, 64), (4, 64), (6, 64)]:
            x = torch.randn(shape, dtype=torch.bfloat16)
            torch.testing.assert_close(f(x), linear(x), rtol=1.6e-2, atol=1e-2)


@pytest.mark.needs_cpp
@needs_bf16_packing
@pytest.mark.parametrize("vendor", ["GenuineIntel", "AuthenticAMD"])
def test_pack_linears_in_bfloat16_keeps_plain_weights_for_one_row(monkeypatch, vendor, tiny):
    monkeypatch.setattr(packed_linear, "cpu_vendor", lambda: vendor)
    model = use_fast_path(tiny()).to(torch.bfloat16)
    kept = one_row_kernel_pays()  # only with AVX512-BF16, on an Intel CPU, does the kernel beat oneDNN's
    assert kept == (vendor == "GenuineIntel" and gemv_kernel() is not None)
    traced = pack_linears(copy.deepcopy(model), opaque=False)  # for torch.compile
    for layer in (traced.lm_head, traced.layers[0].mlp.down_proj):  # plain weights for the kernel, or...
        assert isinstance(layer, OneRowLinear) == kept
        assert isinstance(layer, PackedLinear) == (not kept and onednn_kernel() is not None)  # ...oneDNN's by handle
    if isinstance(traced.lm_head, PackedLinear):
        assert traced.lm_head.handle is not None  # named in the table, for the graph
    packed = pack_linears(copy.deepcopy(model))
    assert isinstance(packed.lm_head, PackedLinear) and (packed.lm_head.weight is not None) == kept
    assert packed.lm_head.handle is None  # eager: not in the table
    ids = torch.randint(0, 97, (1, 1))  # one token: every layer takes the one-row kernel
    torch.testing.assert_close(packed(ids), model(ids), rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(traced(ids), model(ids), rtol=1.6e-2, atol=1e-2)
    compiled = torch.compile(traced, dynamic=True, fullgraph=True)
    with torch.inference_mode():
        for n in (1, 5):  # one row (the one-row kernel or oneDNN), then several (F.linear or oneDNN)
            ids = torch.randint(0, 97, (1, n))
            torch.testing.assert_close(compiled(ids), model(ids), rtol=1.6e-2, atol=1e-2)
    # held twice where kept, read once: a step reads what the unpacked model reads (its table is untied)
    linear = sum(m.weight.numel() * 2 for m in model.modules() if isinstance(m, torch.nn.Linear))  # bf16 bytes
    assert weight_bytes(packed) == weight_bytes(model) + kept * linear + panel_bytes(packed)
    assert weights_read(packed) == weights_read(model)


@pytest.mark.needs_cpp
def test_a_packed_layer_refuses_another_dtype_or_device_and_keeps_working(tiny):
    """`.to()` on a packed layer raised deep inside its kernel ("linear: float32 x [m, k]") or oneDNN's."""
    linear = torch.nn.Linear(64, 32)
    layers = [PackedLinear(linear)] if torch.backends.mkldnn.is_available() else []
    if sgemm_kernel() is not None:
        layers.append(SgemmPackedLinear(linear))
    if amx_kernel() is not None:
        layers.append(AmxLinear.convert(copy.deepcopy(linear).to(torch.bfloat16)))
    if not layers:
        pytest.skip("no packed layer builds here")
    x = torch.randn(3, 64)
    for layer in layers:
        dtype = torch.bfloat16 if isinstance(layer, AmxLinear) else torch.float32
        want = layer(x.to(dtype))
        others = [lambda m: m.to(torch.float16), lambda m: m.to("meta"),
                  lambda m: m.float() if dtype != torch.float32 else m.double()]
        for convert in others:
            with pytest.raises(RuntimeError, match=f"{type(layer).__name__} holds its weight .* pack last"):
                convert(layer)
        assert layer.to(dtype) is layer and layer.cpu() is layer  # nothing to convert: left as it is
        torch.testing.assert_close(layer(x.to(dtype)), want, rtol=0, atol=0)
    model = pack_linears(use_fast_path(tiny()).float())
    if isinstance(model.lm_head, (PackedLinear, SgemmPackedLinear)):
        with pytest.raises(RuntimeError, match="Load the model again"):
            model.to(torch.bfloat16)
