"""float16, what a T4 runs, checked on the default model (SmolLM2-135M) on the CPU.

float16's largest value is 65,504; SmolLM2's residual stream carries a few huge activations (an "attention sink"
on the first token). Rather than assume the margin, the float32 model runs real prompts, a long one among them,
with a hook on every residual-stream and MLP point, and the peak must stay under half of float16's maximum.
Then the float16 model must give float32's logits within a stated tolerance and the same greedy tokens.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from course_lib.kv_cache import KVCache
from course_lib.loading import build_model

FLOAT16_MAX = torch.finfo(torch.float16).max  # 65,504
LONG_TOKENS = 512
PROMPTS = {  # real text: chat turns, plain English, code, Chinese, and the first LONG_TOKENS tokens of the README
    "chat": [{"role": "user", "content": "What is the capital of France?"}],
    "chat 2": [{"role": "user", "content": "Explain the KV cache in one sentence."}],
    "english": "The KV cache stores keys and values so that",
    "code": "def fibonacci(n):\n    ",
    "chinese": "你好，请介绍一下你自己。",
    "long": (Path(__file__).resolve().parents[1] / "README.md").read_text(),
}
LOGIT_TOLERANCE = 1e-2  # max |float16 - float32 logit| / max |float32 logit|; measured up to 4.3e-3
GREEDY_TOKENS = 8


def prompt_ids(tokenizer, prompt) -> list[int]:
    ids = tokenizer.encode_chat(prompt) if isinstance(prompt, list) else tokenizer.encode(prompt)
    return ids[:LONG_TOKENS]


def activation_hooks(model, peaks: dict[str, float]) -> list:
    """Record max |x| at every residual-stream point (after attention, after each block), every MLP point
    (gate, up, silu(gate) * up, down) and the attention projections, into `peaks[point]`."""
    def after(name):
        return lambda mod, inp, out: peaks.__setitem__(name, max(peaks.get(name, 0.0), out.abs().max().item()))

    def before(name):
        return lambda mod, inp: peaks.__setitem__(name, max(peaks.get(name, 0.0), inp[0].abs().max().item()))

    hooks = [model.embed_tokens.register_forward_hook(after("embedding")),
             model.lm_head.register_forward_hook(after("logits"))]
    for i, block in enumerate(model.layers):
        hooks += [block.register_forward_hook(after(f"layer {i} residual out")),
                  block.post_attention_layernorm.register_forward_pre_hook(before(f"layer {i} residual mid")),
                  block.mlp.down_proj.register_forward_pre_hook(before(f"layer {i} mlp silu(gate)*up"))]
        for name in ("gate_proj", "up_proj", "down_proj"):
            hooks.append(getattr(block.mlp, name).register_forward_hook(after(f"layer {i} mlp {name}")))
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            hooks.append(getattr(block.self_attn, name).register_forward_hook(after(f"layer {i} attn {name}")))
    return hooks


@pytest.fixture(scope="module")
def runs(model, tokenizer):
    """Per dtype: each prompt's logits and the activation peaks over all prompts (one forward per prompt)."""
    half = build_model(model.config, dict(model.state_dict()), torch.device("cpu"), torch.float16)
    out = {}
    for dtype, m in ((torch.float32, model), (torch.float16, half)):
        peaks: dict[str, float] = {}
        hooks = activation_hooks(m, peaks)
        try:
            with torch.inference_mode():
                logits = {name: m(torch.tensor([prompt_ids(tokenizer, p)]))[0].float() for name, p in PROMPTS.items()}
        finally:
            for h in hooks:
                h.remove()
        out[dtype] = {"model": m, "logits": logits, "peaks": peaks}
    return out


@pytest.mark.slow
def test_activations_stay_under_half_of_float16s_max(runs, tokenizer):
    assert len(prompt_ids(tokenizer, PROMPTS["long"])) == LONG_TOKENS
    peaks = runs[torch.float32]["peaks"]
    assert len(peaks) == 2 + 30 * 10  # every point of all 30 layers was seen
    point, peak = max(peaks.items(), key=lambda kv: kv[1])
    print(f"float32 activation peak {peak:,.0f} at {point}: {FLOAT16_MAX / peak:.2f}x under float16's max")
    assert peak < FLOAT16_MAX / 2, (point, peak)
    half_peaks = runs[torch.float16]["peaks"]
    assert all(v < FLOAT16_MAX for v in half_peaks.values())  # nothing overflowed to inf (inf > max)


@pytest.mark.slow
def test_float16_logits_match_float32(runs):
    for name in PROMPTS:
        want, got = runs[torch.float32]["logits"][name], runs[torch.float16]["logits"][name]
        assert torch.isfinite(got).all(), name
        rel = ((got - want).abs().max() / want.abs().max()).item()
        print(f"{name}: float16 vs float32 logits, max diff / max |logit| = {rel:.1e}")
        assert rel <= LOGIT_TOLERANCE, (name, rel)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["chat", "chat 2", "chinese"])  # "code" ties on an indent's width
def test_float16_greedy_tokens_match_float32(runs, tokenizer, name):
    answers = {}
    for dtype in (torch.float32, torch.float16):
        m, ids, answer = runs[dtype]["model"], prompt_ids(tokenizer, PROMPTS[name]), []
        cache = KVCache(m.config, len(ids) + GREEDY_TOKENS, dtype=dtype)
        with torch.inference_mode():
            logits = m(torch.tensor([ids]), kv=cache, last_only=True)  # [1, 1, vocab]
            for _ in range(GREEDY_TOKENS):
                answer.append(int(logits[0, -1].argmax()))
                logits = m(torch.tensor([answer[-1:]]), kv=cache, last_only=True)
        answers[dtype] = answer
    assert answers[torch.float16] == answers[torch.float32], [tokenizer.decode(a) for a in answers.values()]
