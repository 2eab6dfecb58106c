"""The from-scratch BPE: its trainer against hand counts, its encoder against the real tokenizer."""
from __future__ import annotations

import random

import pytest

from course_lib.bpe import (BPE, bpe_training_steps, bytes_to_unicode, count_pairs, gpt2_pre_tokenize, merge_pair,
                            smollm_pre_tokenize, symbols_to_bytes, to_symbols, train_bpe, vocab_from_merges)

TEXTS = {
    "english": "Hello world! The year 2024 had 366 days, didn't it? It's 3.14159... We'll see; they'RE here.",
    "chinese": "你好，世界！大语言模型的推理分为预填充（prefill）和解码（decode）两个阶段。首字延迟很重要，吞吐量也是。",
    "code": "def softmax(x):\n    e = [math.exp(v - max(x)) for v in x]\n\treturn [v / sum(e) for v in e]  # 😀\n",
    "emoji": "Inference 🚀🤖 is fun 👍🏽! Family: 👨‍👩‍👧‍👦 flags 🇨🇳🇫🇷",
    "whitespace": "  two leading spaces\r\n\n\nand   many    gaps\t\ttabs \u00a0nbsp\u3000ideographic space   ",
    "numbers": "Pi ≈ 3.14159, ½ + ① + ٣ = 12345678 (٣ is Arabic-Indic three)",
    "special": "<|im_start|>user\n你好<|im_end|>\n<|im_start|>assistant\n",
}


@pytest.fixture(scope="module")
def bpe():
    return BPE.from_gguf()


def test_bytes_to_unicode_is_a_bijection():
    table = bytes_to_unicode()
    assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
    assert table[ord(" ")] == "Ġ" and table[ord("A")] == "A"
    assert symbols_to_bytes("".join(to_symbols("你好 🚀"))) == "你好 🚀".encode()


def test_pre_tokenizers():
    assert gpt2_pre_tokenize("I'm here  now!!") == ["I", "'m", " here", " ", " now", "!!"]
    assert gpt2_pre_tokenize("in 2024") == ["in", " 2024"]
    assert smollm_pre_tokenize("in 2024") == ["in", " ", "2", "0", "2", "4"]  # each digit alone


def test_merge_pair_left_to_right():
    assert merge_pair(("a", "a", "a"), ("a", "a")) == ("aa", "a")
    assert merge_pair(("l", "o", "w", "l", "o"), ("l", "o")) == ("lo", "w", "lo")


def test_trainer_matches_a_hand_count():
    # Word counts: hug 10, pug 5, pun 12, bun 4, hugs 5. By hand:
    #   pairs  h-u 15, u-g 20, p-u 17, u-n 16, b-u 4, g-s 5   -> merge u+g (20)
    #   then   h-ug 15, p-ug 5, p-u 12, u-n 16, b-u 4, ug-s 5 -> merge u+n (16)
    #   then   h-ug 15, p-ug 5, p-un 12, b-un 4, ug-s 5       -> merge h+ug (15)
    text = " ".join(["hug"] * 10 + ["pug"] * 5 + ["pun"] * 12 + ["bun"] * 4 + ["hugs"] * 5)
    steps = list(bpe_training_steps(text, 3, pre_tokenize=str.split))
    assert [(s.pair, s.count) for s in steps] == [(("u", "g"), 20), (("u", "n"), 16), (("h", "ug"), 15)]
    assert steps[-1].words == {("hug",): 10, ("p", "ug"): 5, ("p", "un"): 12, ("b", "un"): 4, ("hug", "s"): 5}


def test_trainer_wikipedia_example_and_tie_break():
    # "aaabdaaabac": aa (4) first; then a+b and aa+a tie at 2: the alphabetically smaller a+b wins;
    # then aa+ab (2): the text becomes X d X a c with X = "aaab".
    steps = list(bpe_training_steps("aaabdaaabac", 3))
    assert [(s.pair, s.count) for s in steps] == [(("a", "a"), 4), (("a", "b"), 2), (("aa", "ab"), 2)]
    assert steps[-1].words == {("aaab", "d", "aaab", "a", "c"): 1}


def test_each_merge_shortens_the_text_by_its_count():
    text = "low low low low low lower lower newest newest newest newest newest newest widest widest widest"
    before = sum(len(to_symbols(w)) for w in gpt2_pre_tokenize(text))
    for step in bpe_training_steps(text, 12):
        assert step.num_tokens == before - step.count
        before = step.num_tokens
    assert train_bpe(text, 2) == [("e", "s"), ("es", "t")]  # 'es' and 'st' tie at 9: 'e' < 's'


def test_training_stops_when_nothing_is_left_to_merge():
    merges = train_bpe("ab ab", 100)
    assert merges == [("a", "b"), ("Ġ", "ab")]
    assert count_pairs({("ab",): 1, ("Ġab",): 1}) == {}


def test_trained_tokenizer_round_trips():
    text = "the cat sat on the mat; the cat ate the rat. 猫坐在垫子上。"
    merges = train_bpe(text, 30)
    tok = BPE(vocab_from_merges(merges), merges)
    ids = tok.encode(text)
    assert len(ids) < len(text.encode())  # merges compress the bytes
    assert tok.decode(ids) == text
    assert tok.tokenize("the cat")[:1] == ["the"]


@pytest.mark.parametrize("kind", TEXTS)
def test_ids_equal_the_real_tokenizer(kind, bpe, tokenizer):
    text = TEXTS[kind]
    ids = bpe.encode(text)
    assert ids == tokenizer.encode(text)
    assert bpe.decode(ids) == tokenizer.decode(ids) == text


def test_ids_equal_transformers(bpe, hf_tokenizer):
    # Not "numbers": transformers' GGUF loader drops SmolLM's digit split, so ' ½' (a numeric
    # character that is not 0-9) stays one word there; SmolLM's own tokenizer.json, llama.cpp
    # and course_lib split it. ASCII digits agree either way (the vocabulary has no digit merges).
    for kind, text in TEXTS.items():
        if kind != "numbers":
            assert bpe.encode(text) == hf_tokenizer.encode(text), kind


def test_random_strings_equal_the_real_tokenizer(bpe, tokenizer):
    rng = random.Random(0)
    alphabet = ([chr(c) for c in range(32, 0x250)] + [chr(c) for c in range(0x4E00, 0x4E40)]
                + ["🚀", "👍🏽", "\u200d", "\u3000", "\u00a0", "\n", "\t", " ", "  ", "'s", "'ll", "<|im_end|>", "2024"])
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        assert bpe.encode(text) == tokenizer.encode(text), repr(text)


def test_a_byte_missing_from_the_vocabulary_is_dropped_like_the_real_tokenizer(bpe, tokenizer):
    assert "Ė" not in bpe.vocab  # byte 0x16 never occurred in SmolLM's training data
    assert bpe.encode("!\x16!") == tokenizer.encode("!\x16!") == tokenizer.encode("!!")


def test_special_tokens_are_single_ids(bpe, tokenizer):
    assert bpe.encode("<|im_start|>") == [1]
    assert bpe.encode("<|im_start|><|im_end|>x<file_sep>") == tokenizer.encode("<|im_start|><|im_end|>x<file_sep>")
    assert bpe.decode([1, 4093, 2], skip_special_tokens=True) == "user"


def test_watch_the_merges_of_one_word(bpe):
    trace = []
    tokens = bpe.bpe(" tokenization", trace)
    assert trace[0] == to_symbols(" tokenization") and trace[-1] == tokens
    assert all(len(b) == len(a) - 1 or len(b) < len(a) for a, b in zip(trace, trace[1:]))
    assert "".join(tokens) == "Ġtokenization"


def test_token_bytes_of_a_chinese_character(bpe, tokenizer):
    for i in bpe.encode("语言模型🚀"):
        assert bpe.token_bytes(i) == tokenizer.token_bytes(i)
