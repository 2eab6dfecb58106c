"""The engine's Transformer against transformers: the default GGUF model and random models of other architectures."""
from __future__ import annotations

import json

import pytest
import torch

import course_lib
from course_lib import tolerance
from course_lib.attention import ReferenceAttention
from course_lib.kv_cache import KVCache

PROMPT = ("The KV cache stores the keys and values of every token the model has already seen, so that "
          "each decode step only computes the query, key and value of the newest token. 大语言模型的推理分为预填充和解码两个阶段。")


def test_default_model_logits_match_transformers(model, hf_model, tokenizer):
    ids = torch.tensor([tokenizer.encode(PROMPT)])
    assert ids.shape[1] >= 64
    with torch.no_grad():
        ours, ref = model(ids), hf_model(ids).logits
    assert ours.shape == ref.shape == (1, ids.shape[1], model.config.vocab_size)
    tolerance.assert_close(ours, ref, tolerance.MODEL_RTOL[torch.float32], "logits")


def test_default_model_greedy_tokens_match_transformers(llm, hf_model, tokenizer):
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Explain what a GPU is."}])
    ids = tokenizer.encode(prompt)
    out = llm.generate([ids], course_lib.SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))[0]
    with torch.no_grad():
        ref = hf_model.generate(torch.tensor([ids]), max_new_tokens=32, min_new_tokens=32, do_sample=False)
    assert out.outputs[0].token_ids == ref[0, len(ids):].tolist()
    assert len(out.outputs[0].token_ids) == 32


def test_the_saved_reference_is_transformers_reading_of_the_gguf_file(hf_model):
    """load_reference_model keeps transformers' float32 reading of the GGUF file once per machine: the copy it
    loads must hold the very same tensors, config and generation settings as a fresh reading."""
    from course_lib.loading import default_gguf_path, load_reference_model, reference_cache_dir

    assert (reference_cache_dir(default_gguf_path()) / "model.safetensors").is_file()
    fresh = load_reference_model(torch.float32, cache=False)
    saved, read = hf_model.state_dict(), fresh.state_dict()
    assert saved.keys() == read.keys() and all(torch.equal(saved[k], read[k]) for k in saved)
    assert hf_model.lm_head.weight.data_ptr() == hf_model.model.embed_tokens.weight.data_ptr()  # still tied
    config = fresh.config.to_diff_dict()
    config.pop("quantization_config")  # how the GGUF file was read; the saved copy is plain float32
    assert hf_model.config.to_diff_dict() == config
    assert hf_model.generation_config == fresh.generation_config


@pytest.mark.parametrize("fixture", ["llama3_dir", "qwen2_dir"])
def test_random_models_match_transformers(fixture, request):
    path, hf = request.getfixturevalue(fixture)
    ours = course_lib.load_model(path, device="cpu")  # the reference runs on the CPU
    cfg = json.loads((path / "config.json").read_text())
    assert ours.config.architecture == cfg["model_type"]
    if fixture == "llama3_dir":
        assert ours.config.rope_scaling["rope_type"] == "llama3" and not ours.config.tie_word_embeddings
        assert not torch.equal(ours.lm_head.weight, ours.embed_tokens.weight)
    else:
        assert ours.config.attention_bias and ours.layers[0].self_attn.q_proj.bias is not None
    ids = torch.randint(0, ours.config.vocab_size, (2, 100), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        tolerance.assert_close(ours(ids), hf(ids).logits, tolerance.MODEL_RTOL[torch.float32], "logits")


def test_llama3_rope_scaling_changes_frequencies(llama3_dir):
    from course_lib.model import rope_inv_freq

    cfg = course_lib.load_model(llama3_dir[0], device="cpu").config
    scaled = rope_inv_freq(cfg)
    plain = rope_inv_freq(type(cfg)(**{**cfg.__dict__, "rope_scaling": None}))
    assert torch.allclose(scaled[0], plain[0])  # the highest frequency (wavelength < 64/4 tokens) is kept
    assert torch.allclose(scaled[-1], plain[-1] / 8)  # the lowest are slowed by `factor`


def test_kv_cache_decoding_equals_full_forward(model, tokenizer):
    ids = torch.tensor([tokenizer.encode(PROMPT)])
    with torch.no_grad():
        full = model(ids)
        cache = KVCache(model.config, max_seq_len=ids.shape[1])
        steps = [model(ids[:, :40], kv=cache)]  # prefill 40 tokens, then decode one at a time
        steps += [model(ids[:, t:t + 1], kv=cache) for t in range(40, ids.shape[1])]
    incremental = torch.cat(steps, dim=1)
    assert cache.seq_len == ids.shape[1]
    tolerance.assert_close(incremental, full, tolerance.MODEL_RTOL[torch.float32], "logits")


def test_reference_attention_matches_sdpa_and_keeps_weights(qwen2_dir):
    m = course_lib.load_model(qwen2_dir[0], device="cpu")
    ids = torch.randint(0, m.config.vocab_size, (1, 12))
    ref = ReferenceAttention()
    with torch.no_grad():
        tolerance.assert_close(m(ids, kv=ref), m(ids), tolerance.MODEL_RTOL[torch.float32], "logits")
    w = ref.weights[0]
    assert w.shape == (1, m.config.num_heads, 12, 12)
    assert torch.allclose(w.sum(-1), torch.ones(1, m.config.num_heads, 12))
    assert w.triu(1).abs().max() == 0  # causal: no token looks ahead


def test_load_model_dtype_by_name(qwen2_dir):
    m = course_lib.load_model(qwen2_dir[0], device="cpu", dtype="bfloat16")
    assert m.dtype == torch.bfloat16 and m(torch.tensor([[1, 2, 3]])).dtype == torch.bfloat16


def test_unknown_model_says_what_was_looked_for(tmp_path):
    with pytest.raises(FileNotFoundError, match="unknown model 'no-such-model'"):
        course_lib.load_model("no-such-model")
    with pytest.raises(FileNotFoundError, match="config.json"):
        course_lib.load_model(tmp_path)  # an empty directory


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        course_lib.load_model(tmp_path)


def test_corrupt_files_say_so(tmp_path, qwen2_dir):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(ValueError, match="corrupt"):
        course_lib.load_model(bad)
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text((qwen2_dir[0] / "config.json").read_text())
    (d / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="corrupt"):
        course_lib.load_model(d)


def test_reference_attention_keeps_the_model_dtype(qwen2_dir):
    m = course_lib.load_model(qwen2_dir[0], device="cpu", dtype=torch.bfloat16)
    ref = ReferenceAttention()
    assert m(torch.tensor([[1, 2, 3, 4]]), kv=ref).dtype == torch.bfloat16
    assert ref.weights[0].dtype == torch.float32  # the weights themselves are computed in float32
