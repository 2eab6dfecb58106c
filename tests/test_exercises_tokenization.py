"""Checkers of notebook 01: each passes a reference solution and fails plausible mistakes and an unattempted stub."""
from __future__ import annotations

import re

import pytest
import regex

from course_lib.bpe import (BPE, gpt2_pre_tokenize, merge_pair, smollm_pre_tokenize, symbols_to_bytes, to_symbols,
                            train_bpe, vocab_from_merges)
from course_lib.exercises import (check_chars_by_token_count, check_indent_costs, check_split_words,
                                  check_toy_tokenize)
from course_lib.exercises import tokenization as T

# --- exercise 1 ---------------------------------------------------------------------------------------------------


def toy_tokenize(training_text, num_merges, text):
    """By hand: pre-tokenize, write each word as byte symbols, apply the merges in the order learned."""
    merges = train_bpe(training_text, num_merges)
    tokens = []
    for word in gpt2_pre_tokenize(text):
        symbols = to_symbols(word)
        for pair in merges:
            symbols = merge_pair(symbols, pair)
        tokens.extend(symbols)
    return tokens


def toy_tokenize_with_bpe(training_text, num_merges, text):
    merges = train_bpe(training_text, num_merges)
    return BPE(vocab_from_merges(merges), merges).tokenize(text)


def longest_match(training_text, num_merges, text):
    """WordPiece-style: the longest vocabulary entry that fits, left to right (not BPE)."""
    vocab = vocab_from_merges(train_bpe(training_text, num_merges))
    tokens = []
    for word in gpt2_pre_tokenize(text):
        s, i = "".join(to_symbols(word)), 0
        while i < len(s):
            j = len(s)
            while s[i:j] not in vocab:
                j -= 1
            tokens.append(s[i:j])
            i = j
    return tokens


def no_pre_tokenizer(training_text, num_merges, text):
    symbols = to_symbols(text)
    for pair in train_bpe(training_text, num_merges):
        symbols = merge_pair(symbols, pair)
    return list(symbols)


def readable_spelling(training_text, num_merges, text):
    """The stale solution's mistake: ' the' where the vocabulary says 'Ġthe'."""
    return [symbols_to_bytes(t).decode("utf-8", "replace") for t in toy_tokenize(training_text, num_merges, text)]


def one_merge_short(training_text, num_merges, text):
    return toy_tokenize(training_text, max(num_merges - 1, 0), text)


# --- exercise 2 ---------------------------------------------------------------------------------------------------


def split_words(text):
    return [w for piece in regex.findall(r"\p{N}|\P{N}+", text) for w in gpt2_pre_tokenize(piece)]


def split_gpt2_only(text):
    return gpt2_pre_tokenize(text)


def split_three_digits(text):
    """Llama 3 / GPT-4 style: up to three digits together."""
    return [w for piece in regex.findall(r"\p{N}{1,3}|\P{N}+", text) for w in gpt2_pre_tokenize(piece)]


def split_ascii_digits(text):
    return [w for piece in re.findall(r"[0-9]|[^0-9]+", text) for w in gpt2_pre_tokenize(piece)]


def split_digits_only(text):
    return regex.findall(r"\p{N}|\P{N}+", text)


def split_isnumeric(text):
    """str.isnumeric is True for 三 (a letter with a numeric value): the Rust pre-tokenizer keeps it a letter."""
    pieces, run = [], ""
    for ch in text:
        if ch.isnumeric():
            pieces += [run, ch] if run else [ch]
            run = ""
        else:
            run += ch
    pieces += [run] if run else []
    return [w for piece in pieces for w in gpt2_pre_tokenize(piece)]


# --- exercise 3 ---------------------------------------------------------------------------------------------------


def chars_by_token_count(tok, text, count=lambda tok, ch: len(tok.encode(ch)), distinct=True,
                         keep=lambda ch: "\u4e00" <= ch <= "\u9fff"):
    out = {}
    for ch in (dict.fromkeys(text) if distinct else text):
        if keep(ch):
            n = count(tok, ch)
            out[n] = out.get(n, "") + ch
    return out


def chars_by_bytes(tok, text):
    return chars_by_token_count(tok, text, count=lambda tok, ch: len(ch.encode()))


def chars_repeated(tok, text):
    return chars_by_token_count(tok, text, distinct=False)


def chars_not_only_chinese(tok, text):
    return chars_by_token_count(tok, text, keep=lambda ch: not ch.isspace())


def chars_as_lists(tok, text):
    return {n: list(chars) for n, chars in chars_by_token_count(tok, text).items()}


# --- exercise 4 ---------------------------------------------------------------------------------------------------


def indent_costs(tok, code):
    tabs = re.sub(r"^(?:    )+", lambda m: "\t" * (len(m.group()) // 4), code, flags=re.M)
    return len(tok.encode(code)), len(tok.encode(tabs))


def indent_replace_everywhere(tok, code):
    return len(tok.encode(code)), len(tok.encode(code.replace("    ", "\t")))


def indent_first_level_only(tok, code):
    return len(tok.encode(code)), len(tok.encode(re.sub(r"^    ", "\t", code, flags=re.M)))


def indent_characters(tok, code):
    return len(code), len(T.with_tabs(code))


def indent_swapped(tok, code):
    return indent_costs(tok, code)[::-1]


def stub(*args):
    raise NotImplementedError


# --- tests --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("solution", [toy_tokenize, toy_tokenize_with_bpe])
def test_toy_tokenize_passes_solutions(solution):
    assert check_toy_tokenize(solution) is True


@pytest.mark.parametrize("wrong,hint", [
    (longest_match, "order they were learned"),
    (no_pre_tokenizer, "word boundary"),
    (readable_spelling, "'Ġthe', not ' the'"),
    (one_merge_short, "expected"),
    (lambda a, n, t: " ".join(toy_tokenize(a, n, t)), "list of token strings"),
])
def test_toy_tokenize_fails_mistakes(wrong, hint, capsys):
    assert check_toy_tokenize(wrong) is False
    assert hint in capsys.readouterr().out


def test_split_words_passes_solution():
    assert check_split_words(split_words) is True
    assert check_split_words(smollm_pre_tokenize) is True


@pytest.mark.parametrize("wrong,hint", [
    (split_gpt2_only, "every digit on its own"),
    (split_three_digits, "every digit on its own"),
    (split_ascii_digits, "every digit on its own"),  # full-width digits are digits too
    (split_digits_only, "GPT-2's pattern"),
    (split_isnumeric, "expected"),
    (lambda text: split_words(text.strip()), "give back the text"),
])
def test_split_words_fails_mistakes(wrong, hint, capsys):
    assert check_split_words(wrong) is False
    assert hint in capsys.readouterr().out


def test_chars_by_token_count_passes_solution(tokenizer):
    assert check_chars_by_token_count(chars_by_token_count, tokenizer) is True
    assert check_chars_by_token_count(chars_as_lists, tokenizer) is True  # lists of characters are fine too


@pytest.mark.parametrize("wrong,hint", [
    (chars_by_bytes, "UTF-8 bytes"),
    (chars_repeated, "each character once"),
    (chars_not_only_chinese, "not a Chinese character"),
    (lambda tok, text: list(chars_by_token_count(tok, text).items()), "return a dict"),
])
def test_chars_by_token_count_fails_mistakes(wrong, hint, tokenizer, capsys):
    assert check_chars_by_token_count(wrong, tokenizer) is False
    assert hint in capsys.readouterr().out


def test_chars_by_token_count_uses_the_tokenizer_passed_in(tokenizer, capsys):
    """Always encoding with the chapter's tokenizer fails the toy-tokenizer case."""
    assert check_chars_by_token_count(lambda tok, text: chars_by_token_count(tokenizer, text), tokenizer) is False
    assert "tokenizer passed in" in capsys.readouterr().out


def test_indent_costs_passes_solution(tokenizer):
    assert check_indent_costs(indent_costs, tokenizer) is True


@pytest.mark.parametrize("wrong,hint", [
    (indent_replace_everywhere, "only indents become tabs"),
    (indent_first_level_only, "every indent level"),
    (indent_characters, "those are characters"),
    (indent_swapped, "the order is"),
    (lambda tok, code: len(tok.encode(code)), "return two numbers"),
])
def test_indent_costs_fails_mistakes(wrong, hint, tokenizer, capsys):
    assert check_indent_costs(wrong, tokenizer) is False
    assert hint in capsys.readouterr().out


@pytest.mark.parametrize("check,needs_tokenizer", [
    (check_toy_tokenize, False), (check_split_words, False),
    (check_chars_by_token_count, True), (check_indent_costs, True),
])
def test_stub_is_not_attempted(check, needs_tokenizer, tokenizer, capsys):
    assert (check(stub, tokenizer) if needs_tokenizer else check(stub)) is False
    assert "not attempted" in capsys.readouterr().out


def test_references_agree_with_the_real_tokenizer(tokenizer):
    """The checkers' references are the engine's tokenizer: SmolLM's split gives its ids word by word."""
    bpe = BPE.from_gguf()
    for text in T.SPLIT_TEXTS:
        assert [i for w in smollm_pre_tokenize(text) for i in bpe.encode(w)] == tokenizer.encode(text)
    assert T.with_tabs("x\n    y  = 1\n          z\n") == "x\n\ty  = 1\n\t\t  z\n"


@pytest.mark.parametrize("wrong", [
    lambda tok, text: {1: 5},          # counts where characters belong
    lambda tok, text: {"1": "人"},     # a string key
    lambda tok, text: {1: None},
])
def test_odd_return_values_fail_without_raising(wrong, tokenizer, capsys):
    assert check_chars_by_token_count(wrong, tokenizer) is False
    assert "✗" in capsys.readouterr().out
