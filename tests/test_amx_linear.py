"""The AMX kernel for a few bfloat16 rows (`amx_linear_cpu.cpp`, `packed_linear.AmxLinear`) against F.linear."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from course_lib.config import ModelConfig
from course_lib.cpp_build import load_cpu_extension, toolchain_available
from course_lib.fast_path import use_fast_path
from course_lib.packed_linear import AMX_MAX_ROWS, AMX_SOURCE, AmxLinear, amx_kernel, can_pack, pack_linears
from course_lib.model import Transformer
from course_lib.profiling.memory import weight_bytes
from course_lib.profiling.roofline import weights_read

pytestmark = pytest.mark.skipif(not toolchain_available(), reason="no C++ compiler or ninja here")


@pytest.fixture(scope="module")
def kernel():
    """The kernel; skip where the CPU has no AMX, fail where it does not build."""
    assert load_cpu_extension("amx_linear", AMX_SOURCE) is not None  # a toolchain is here: it must build
    if amx_kernel() is None:
        pytest.skip("this CPU (or its Linux) gives no AMX: the engine keeps oneDNN")
    return amx_kernel()


def bf16(*shape) -> torch.Tensor:
    return torch.randn(*shape).to(torch.bfloat16)


# outputs: 1 and 5 blocks of 16 (an odd count: the last task has one block); rows: below, at and past 16
@pytest.mark.parametrize("n,k", [(16, 32), (80, 64), (96, 1536)])
@pytest.mark.parametrize("rows", [1, 2, 15, 16, 17, 40, 64])
def test_kernel_matches_linear(kernel, n, k, rows):
    torch.manual_seed(rows)
    w, x = bf16(n, k), bf16(rows, k)
    got = kernel.linear(x, kernel.pack(w))
    want = F.linear(x.float(), w.float())  # exact products, float sums: the kernel rounds once, at the end
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
    torch.testing.assert_close(got.float(), want, rtol=2**-8, atol=1e-3 * want.abs().max().item())


def test_kernel_refuses_shapes_its_tiles_do_not_fit(kernel):
    with pytest.raises(RuntimeError, match="N % 16 == 0 and K % 32 == 0"):
        kernel.pack(bf16(24, 64))
    with pytest.raises(RuntimeError, match="bfloat16"):
        kernel.pack(torch.randn(16, 64))
    with pytest.raises(RuntimeError, match="K columns"):
        kernel.linear(bf16(2, 96), kernel.pack(bf16(16, 64)))


@pytest.mark.parametrize("bias", [False, True])
def test_amx_layer_matches_its_plain_twin(kernel, bias):
    torch.manual_seed(0)
    plain = torch.nn.Linear(64, 48, bias=bias).to(torch.bfloat16)
    layer = AmxLinear.convert(copy.deepcopy(plain))
    assert layer.amx_weight.shape == (3, 2, 16, 32)  # 3 blocks of 16 outputs x 2 of 32 inputs
    # one row (the one-row kernel), a few (the tiles), more than AMX_MAX_ROWS (F.linear)
    for shape in [(1, 64), (1, 1, 64), (5, 64), (2, 3, 64), (AMX_MAX_ROWS + 1, 64)]:
        x = bf16(*shape)
        torch.testing.assert_close(layer(x), plain(x), rtol=1.6e-2, atol=1e-2)
    f = torch.compile(layer, dynamic=True, fullgraph=True)  # the operator traces, one row and many
    with torch.inference_mode():
        for rows in (1, 4, 6):
            x = bf16(rows, 64)
            torch.testing.assert_close(f(x), plain(x), rtol=1.6e-2, atol=1e-2)


def fitting_model() -> Transformer:
    """A small model whose every linear layer fits the tiles (outputs % 16, inputs % 32)."""
    cfg = ModelConfig(vocab_size=112, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                      num_kv_heads=2, tie_word_embeddings=False, max_position_embeddings=64)
    torch.manual_seed(0)
    model = Transformer(cfg)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return use_fast_path(model.eval()).to(torch.bfloat16)


@pytest.mark.skipif(not can_pack("cpu", torch.bfloat16), reason="this CPU's oneDNN has no bfloat16 kernels")
@pytest.mark.parametrize("opaque", [True, False])
def test_pack_linears_gives_every_fitting_layer_the_tiles(kernel, opaque):
    model = fitting_model()
    packed = pack_linears(copy.deepcopy(model), opaque=opaque)
    layers = [m for m in packed.modules() if isinstance(m, torch.nn.Linear)]
    assert len(layers) == 2 * 4 + 1 and all(type(m) is AmxLinear for m in layers)
    with torch.inference_mode():
        for tokens in (1, 7):  # one row through the one-row kernel, seven through the tiles
            ids = torch.randint(0, 112, (1, tokens))
            torch.testing.assert_close(packed(ids), model(ids), rtol=1.6e-2, atol=2e-2)
    # held twice (plain and tiles), read once: a step reads what the plain model reads
    linear = sum(m.weight.numel() * 2 for m in model.modules() if isinstance(m, torch.nn.Linear))  # bf16 bytes
    assert weight_bytes(packed) == weight_bytes(model) + linear
    assert weights_read(packed) == weights_read(model)


@pytest.mark.skipif(not can_pack("cpu", torch.bfloat16), reason="this CPU's oneDNN has no bfloat16 kernels")
def test_compiled_decode_step_calls_the_tiles_and_matches_eager(kernel):
    """torch.compile for real (~1 minute on 2 cores): a batched decode step's graph calls the tiles as an
    operator, and its logits are the eager step's, up to bfloat16 rounding (Inductor fuses the elementwise
    steps in float, so tokens may part after a near tie; the float32 engine test compares tokens)."""
    from course_lib.attention.paged import PagedKVCache
    from course_lib.engine.compiled_decode import CompiledDecodeStep, decode_step
    from test_compiled_decode import tiny_model

    model = pack_linears(use_fast_path(tiny_model(torch.bfloat16)), opaque=False)
    assert type(model.lm_head) is AmxLinear and type(model.layers[0].mlp.down_proj) is AmxLinear
    cache = PagedKVCache(model.config, num_blocks=16, block_size=4, dtype=torch.bfloat16)
    torch.manual_seed(1)
    cache.k_cache.normal_()
    cache.v_cache.normal_()
    step = CompiledDecodeStep(model, cache, use_cpp=True)
    step.warmup()
    tables = [[3, 0, 0], [1, 7, 0], [2, 9, 11]]
    with torch.inference_mode():  # inputs made as the engine makes them: the graphs of warmup() fit them
        ids, positions = torch.tensor([5, 17, 300]), torch.tensor([0, 5, 9])  # tokens cached before each
        want = decode_step(model, cache, ids, positions, torch.tensor(tables, dtype=torch.int32),
                           positions.to(torch.int32), use_cpp=True)[0]
        with torch.profiler.profile(record_shapes=True) as prof:  # the graph calls the operator from C++
            got = step(ids, positions, tables, torch.tensor([0, 21, 37]))
    calls = [e.input_shapes[0][0] for e in prof.events() if e.name == "course_lib::amx_linear"]  # rows of x
    assert calls == [3] * (2 * 4 + 1)  # every layer of the graph: 2 blocks x 4 linears, and the lm_head
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2 * want.abs().max().item())
