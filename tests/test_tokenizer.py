"""Tokenizer ids against transformers' tokenizer; the streaming detokenizer never emits half a character."""
from __future__ import annotations

import pytest

from course_lib import StreamingDetokenizer, load_tokenizer

TEXTS = {
    "english": "Hello world! The year 2024 had 366 days, didn't it? It's 3.14159...",
    "chinese": "你好，世界！大语言模型的推理分为预填充（prefill）和解码（decode）两个阶段。首字延迟很重要。",
    "code": "def softmax(x):\n    e = [math.exp(v - max(x)) for v in x]\n\treturn [v / sum(e) for v in e]  # 😀\n",
    "emoji": "Inference 🚀🤖 is fun 👍🏽! Family: 👨‍👩‍👧‍👦 flags 🇨🇳🇫🇷",
    "whitespace": "  two leading spaces\r\n\n\nand   many    gaps\t\ttabs ",
    "special": "<|im_start|>user\nhi<|im_end|>\n",
}


@pytest.mark.parametrize("kind", TEXTS)
def test_ids_match_transformers(kind, tokenizer, hf_tokenizer):
    text = TEXTS[kind]
    ids = tokenizer.encode(text)
    assert ids == hf_tokenizer.encode(text)
    assert tokenizer.decode(ids) == hf_tokenizer.decode(ids) == text


def test_chat_template_matches_transformers(tokenizer, hf_tokenizer):
    conv = [{"role": "system", "content": "你是一个乐于助人的助手。"}, {"role": "user", "content": "什么是KV缓存？"},
            {"role": "assistant", "content": "它保存键和值。"}, {"role": "user", "content": "Why?"}]
    for messages in (conv, conv[1:2]):
        text = tokenizer.apply_chat_template(messages)
        assert text == hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert text.endswith("<|im_start|>assistant\n")
        assert tokenizer.encode_chat(messages) == hf_tokenizer.encode(text)


def test_special_tokens(tokenizer):
    assert tokenizer.eos_token_ids == [2] and tokenizer.bos_token_id == 1
    assert tokenizer.encode("<|im_start|>") == [1]  # a special token is one id, not pieces
    assert tokenizer.decode([1, 4093, 2], skip_special_tokens=True) == "user"


@pytest.mark.parametrize("kind", TEXTS)
def test_streaming_deltas_join_to_the_full_decode(kind, tokenizer):
    ids = tokenizer.encode(TEXTS[kind])
    detok = StreamingDetokenizer(tokenizer, skip_special_tokens=False)
    deltas = [detok.add(i) for i in ids] + [detok.flush()]
    assert "".join(deltas) == tokenizer.decode(ids)
    assert not any("\ufffd" in d for d in deltas)


def test_streaming_holds_back_a_split_character(tokenizer):
    ids = tokenizer.encode("🚀")
    assert len(ids) > 1  # one emoji, several byte-level tokens
    detok = StreamingDetokenizer(tokenizer)
    assert [detok.add(i) for i in ids[:-1]] == [""] * (len(ids) - 1)  # nothing until the character completes
    assert detok.add(ids[-1]) == "🚀"


def test_token_bytes_concatenate_to_utf8(tokenizer):
    text = TEXTS["chinese"]
    assert b"".join(tokenizer.token_bytes(i) for i in tokenizer.encode(text)) == text.encode()


def test_hf_directory_without_tokenizer_json_says_so(qwen2_dir):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(qwen2_dir[0])  # the random model was saved without a tokenizer
