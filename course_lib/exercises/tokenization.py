"""Checkers for chapter 01 (tokenization): a toy BPE's tokens, SmolLM's pre-tokenizer, Chinese characters by token
count, the cost of tabs against spaces.

    check_toy_tokenize(toy_tokenize)                 fn(training_text, num_merges, text) -> tokens ('Ġthe', ...)
    check_split_words(split_words)                   fn(text) -> SmolLM's pre-tokenized words
    check_chars_by_token_count(chars_by_token_count, tok)   fn(tok, text) -> {tokens: "characters"}
    check_indent_costs(indent_costs, tok)            fn(tok, code) -> (tokens with 4 spaces, tokens with tabs)

The references are `course_lib.bpe` (trained and encoded from scratch, itself tested against the Rust `tokenizers`)
and the tokenizer passed in; each checker also uses texts, merge counts and a toy tokenizer that the chapter does not,
so an answer written for the chapter's one example does not pass.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Callable

from ..bpe import (BPE, gpt2_pre_tokenize, smollm_pre_tokenize, symbols_to_bytes, to_symbols, train_bpe,
                   vocab_from_merges)
from .check import Case, run_checks


def _show(tokens: Any, limit: int = 14) -> str:
    """A list, shortened for a message."""
    if isinstance(tokens, (list, tuple)) and len(tokens) > limit:
        return repr(list(tokens[:limit]))[:-1] + f", ... ({len(tokens)} in all)]"
    return repr(tokens)


def _first_difference(got: list, want: list) -> str:
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return f"first difference at position {i}: got {g!r}, expected {w!r}"
    return f"got {len(got)} items, expected {len(want)}"


# --- exercise 1: train a toy BPE and tokenize with it --------------------------------------------------------------

# Sennrich et al.'s example words, a text with runs of spaces, Chinese bytes, digits and punctuation.
SENNRICH = "low low low low low lower lower newest newest newest newest newest newest widest widest widest"
SPACES = "a  cat  sat;   the  cat  ate.    a  hat  on  a  mat"
PROMPTS = ("prefill reads the prompt; decode writes the answer. prefill once, decode many times. "
           "the prompt is 1024 tokens, the answer 256 tokens.")
ZH = "预填充处理提示词，解码逐个生成词元。预填充快，解码慢。"


def toy_tokens(training_text: str, num_merges: int, text: str) -> list[str]:
    """The reference: `course_lib.bpe` trains the merges and encodes `text` with them."""
    merges = train_bpe(training_text, num_merges)
    return BPE(vocab_from_merges(merges), merges).tokenize(text)


def _readable(tokens: list[str]) -> list[str]:
    return [symbols_to_bytes(t).decode("utf-8", errors="replace") for t in tokens]


def _crosses_words(tokens: list[str], text: str) -> bool:
    """True when some token spans the boundary between two of GPT-2's pre-tokenized words."""
    ends, at = set(), 0
    for word in gpt2_pre_tokenize(text):
        at += len(to_symbols(word))
        ends.add(at)
    cuts, at = set(), 0
    for t in tokens:
        at += len(t)
        cuts.add(at)
    return not ends <= cuts


def _toy_case(training_text: str, num_merges: int, text: str, what: str) -> Case:
    want = toy_tokens(training_text, num_merges, text)

    def verify(got: Any) -> None:
        assert isinstance(got, (list, tuple)) and all(isinstance(t, str) for t in got), \
            f"return a list of token strings, got {_show(got)}"
        got = list(got)
        if got == want:
            return
        hint = ""
        if got == _readable(want):
            hint = ("; hint: spell the tokens as the vocabulary does, byte symbols and all: a leading space is 'Ġ' "
                    "('Ġthe', not ' the'), as `BPE.tokenize` and `to_symbols` give them")
        elif "".join(got) != "".join(want):
            hint = "; hint: the tokens joined must spell the whole text in byte symbols (`to_symbols` of each word)"
        elif _crosses_words(got, text):
            hint = ("; hint: merges never cross a word boundary: cut the text with `gpt2_pre_tokenize` first, "
                    "then merge inside each word")
        else:
            hint = ("; hint: apply the merges in the order they were learned (lowest rank first), every occurrence "
                    "in each word, not the longest vocabulary entry that fits")
        raise AssertionError(f"got {_show(got)}, expected {_show(want)} ({_first_difference(got, want)}){hint}")

    return Case(f"{num_merges} merges learned from {what}; tokenize {text!r}", (training_text, num_merges, text),
                verify)


def check_toy_tokenize(fn: Callable[[str, int, str], list[str]]) -> bool:
    """`fn(training_text, num_merges, text)` -> the tokens of `text` (vocabulary spelling) under a BPE trained with
    `num_merges` merges on `training_text`; compared with `course_lib.bpe` on texts the chapter does not use."""
    cases = [
        _toy_case(SENNRICH, 10, "lowest newer wildest", "Sennrich et al.'s low/lower/newest/widest"),
        _toy_case(SENNRICH, 0, "low", "Sennrich et al.'s words (no merges: bytes only)"),
        _toy_case(SPACES, 10, "the  cat   ate a hat", "a text with runs of spaces"),
        _toy_case(PROMPTS, 40, "decode the prompt twice, 2048 tokens!", "a text about prefill and decode"),
        _toy_case(ZH, 15, "解码预填充的词元", "a Chinese text (merges of bytes)"),
    ]
    return run_checks("check_toy_tokenize", fn, cases)


# --- exercise 2: SmolLM's pre-tokenizer ----------------------------------------------------------------------------

SPLIT_TEXTS = [
    "1234567890 or one billion",
    "In 2024, prices rose 3.5% (not 35%).",
    "x1 = y22 + 333  # three digits",
    "第3章 共12页，第三章，２０２４年",  # full-width digits are digits; 三 is a letter (an ideograph)
    "  two leading spaces, a 7 and a tab\tthen 99\n",
]


def _split_case(text: str) -> Case:
    want = smollm_pre_tokenize(text)

    def verify(got: Any) -> None:
        assert isinstance(got, (list, tuple)) and all(isinstance(w, str) for w in got), \
            f"return a list of strings, got {_show(got)}"
        got = list(got)
        if got == want:
            return
        if "".join(got) != text:
            hint = "the words joined must give back the text, every space and character of it"
        elif any(sum(c.isdigit() for c in w) > 1 for w in got):
            many = next(w for w in got if sum(c.isdigit() for c in w) > 1)
            hint = (f"{many!r} holds more than one digit: SmolLM puts every digit on its own "
                    f"('2024' -> '2', '0', '2', '4'), before GPT-2's pattern runs")
        elif len(got) < len(want):
            hint = "after the digit split, cut each remaining piece with GPT-2's pattern (`gpt2_pre_tokenize`)"
        else:
            hint = ("keep the text between two digits in one piece and let GPT-2's pattern cut it: a space before a "
                    "word stays with the word (' prices')")
        raise AssertionError(f"got {_show(got)}, expected {_show(want)} ({_first_difference(got, want)}); "
                             f"hint: {hint}")

    return Case(f"split {text!r}", (text,), verify)


def check_split_words(fn: Callable[[str], list[str]]) -> bool:
    """`fn(text)` -> the words SmolLM's pre-tokenizer cuts `text` into: every digit alone (any Unicode digit,
    regex `\\p{N}`), then GPT-2's pattern on the rest; compared with `course_lib.bpe.smollm_pre_tokenize`."""
    return run_checks("check_split_words", fn, [_split_case(t) for t in SPLIT_TEXTS])


# --- exercise 3: Chinese characters by their number of tokens ------------------------------------------------------

ZH_TEXTS = [
    "大语言模型的推理分为预填充和解码两个阶段。",
    "人工智能正在改变世界，我们需要理解它。人工智能需要数据。",
    "KV缓存 saves 时间 🚀, 首字延迟 (TTFT) matters!",
]
ZH_TRAINING = "预填充处理提示词，解码逐个生成词元。预填充快，解码慢。生成的词元越多，解码越慢。"


def is_han(ch: str) -> bool:
    """A CJK unified ideograph of the basic block (U+4E00 to U+9FFF): what this chapter calls a Chinese character."""
    return "\u4e00" <= ch <= "\u9fff"


def chars_by_tokens(tok: Any, text: str) -> dict[int, str]:
    """The reference: each distinct Chinese character of `text`, by the number of tokens `tok.encode(ch)` gives it."""
    out: dict[int, str] = {}
    for ch in dict.fromkeys(c for c in text if is_han(c)):
        n = len(tok.encode(ch))
        out[n] = out.get(n, "") + ch
    return out


@lru_cache(maxsize=1)
def chinese_toy_tokenizer() -> BPE:
    """A byte-level BPE with 30 merges learned from a short Chinese text: characters of 1, 2 and 3 tokens."""
    merges = train_bpe(ZH_TRAINING, 30)
    return BPE(vocab_from_merges(merges), merges)


def _chars_case(tok: Any, text: str, what: str) -> Case:
    want = chars_by_tokens(tok, text)

    def verify(got: Any) -> None:
        assert isinstance(got, dict), f"return a dict {{number of tokens: characters}}, got {type(got).__name__}"
        got = {k: "".join(v) if isinstance(v, (list, tuple)) else v for k, v in got.items()}
        if got == want:
            return
        chars = "".join(v for v in got.values() if isinstance(v, str))
        if set(got) == {3} and len(want) > 1:
            hint = "every character counted 3: that is its UTF-8 bytes; count its tokens, len(tok.encode(ch))"
        elif any(not is_han(c) for c in chars):
            odd = next(c for c in chars if not is_han(c))
            hint = f"{odd!r} is not a Chinese character: keep only '\\u4e00' <= ch <= '\\u9fff'"
        elif len(set(chars)) < len(chars):
            hint = "list each character once, even if the text repeats it"
        elif {k: set(v) for k, v in got.items()} == {k: set(v) for k, v in want.items()}:
            hint = "right characters; list them in the order they first appear in the text"
        else:
            wrong = [c for c in dict.fromkeys(chars) if c not in got.get(len(tok.encode(c)), "")]
            hint = (f"e.g. {wrong[0]!r} is {len(tok.encode(wrong[0]))} token(s) with this tokenizer (encode each "
                    f"character on its own, with the tokenizer passed in)" if wrong else "a character is missing")
        raise AssertionError(f"got {got}, expected {want}; hint: {hint}")

    return Case(f"{what}: {text[:24]!r}{'...' if len(text) > 24 else ''}", (tok, text), verify)


def check_chars_by_token_count(fn: Callable[[Any, str], dict[int, str]], tok: Any) -> bool:
    """`fn(tok, text)` -> {number of tokens: the distinct Chinese characters of `text` that take that many, in order
    of first appearance}; checked with `tok` on other texts, and with a toy BPE trained on Chinese."""
    toy = chinese_toy_tokenizer()
    cases = [_chars_case(tok, t, "the chapter's tokenizer") for t in ZH_TEXTS]
    cases.append(_chars_case(toy, ZH_TRAINING + "人工智能", "a toy BPE with 30 merges learned from Chinese"))
    return run_checks("check_chars_by_token_count", fn, cases)


# --- exercise 4: four spaces or a tab ------------------------------------------------------------------------------

CODE_NESTED = '''class Cache:
    def __init__(self, size):
        self.size = size
        self.blocks = []

    def append(self, block):
        if len(self.blocks) < self.size:
            self.blocks.append(block)
        else:
            raise MemoryError("cache full")
'''
CODE_ALIGNED = '''def config():
    return dict(
        hidden    = 576,      # columns aligned with spaces
        layers    = 30,
        heads     = 9,
    )
'''
CODE_CONTINUED = '''def attention(q, k, v, mask=None,
              scale=None):
    scores = q @ k.T
    if mask is not None:
        scores = scores + mask
    return softmax(scores) @ v
'''
CODE_TRAINING = CODE_NESTED + CODE_CONTINUED + CODE_NESTED.replace("Cache", "Pool").replace("blocks", "pages")


def with_tabs(code: str) -> str:
    """Each group of 4 spaces at the start of a line becomes one tab; spaces elsewhere stay."""
    return re.sub(r"^(?:    )+", lambda m: "\t" * (len(m.group(0)) // 4), code, flags=re.M)


def indent_tokens(tok: Any, code: str) -> tuple[int, int]:
    """The reference: tokens of `code` as written (4-space indents) and with each indent level a tab."""
    return len(tok.encode(code)), len(tok.encode(with_tabs(code)))


@lru_cache(maxsize=1)
def code_toy_tokenizer() -> BPE:
    """A byte-level BPE with 80 merges learned from Python code indented with spaces."""
    merges = train_bpe(CODE_TRAINING, 80)
    return BPE(vocab_from_merges(merges), merges)


def _indent_case(tok: Any, code: str, what: str) -> Case:
    spaces, tabs = want = indent_tokens(tok, code)

    def verify(got: Any) -> None:
        assert isinstance(got, (tuple, list)) and len(got) == 2, \
            f"return two numbers, (tokens with 4-space indents, tokens with tabs), got {_show(got)}"
        got = tuple(got)
        assert all(isinstance(n, int) and not isinstance(n, bool) for n in got), \
            f"return two ints (token counts), got {got!r}"
        if got == want:
            return
        if got == (len(code), len(with_tabs(code))):
            hint = "those are characters: count tokens, len(tok.encode(...))"
        elif got == (tabs, spaces):
            hint = "the order is (4 spaces, tabs)"
        elif got[0] != spaces:
            hint = f"the code as given (4-space indents) is {spaces} tokens with this tokenizer: encode it unchanged"
        elif got[1] == len(tok.encode(code.replace("    ", "\t"))):
            hint = "only indents become tabs: 4 spaces in the middle of a line (alignment) stay spaces"
        else:
            hint = ("every indent level becomes a tab: 8 spaces at the start of a line are two tabs, and spaces "
                    "after the last full group of 4 stay as they are")
        raise AssertionError(f"got {got}, expected {want}; hint: {hint}")

    first = code.splitlines()[0]
    return Case(f"{what}: {first!r} ...", (tok, code), verify)


def check_indent_costs(fn: Callable[[Any, str], tuple[int, int]], tok: Any) -> bool:
    """`fn(tok, code)` -> (tokens of `code` with its 4-space indents, tokens with each indent level a tab), checked
    with `tok` on code the chapter does not use, and with a toy BPE learned from code."""
    cases = [
        _indent_case(tok, CODE_NESTED, "nested blocks"),
        _indent_case(tok, CODE_ALIGNED, "alignment spaces mid-line"),
        _indent_case(tok, CODE_CONTINUED, "a continued line (14 spaces)"),
        _indent_case(code_toy_tokenizer(), CODE_NESTED, "a toy BPE learned from code"),
        _indent_case(BPE(vocab_from_merges([]), []), CODE_NESTED, "a BPE with no merges (one token per byte)"),
    ]
    return run_checks("check_indent_costs", fn, cases)


__all__ = ["check_toy_tokenize", "check_split_words", "check_chars_by_token_count", "check_indent_costs",
           "toy_tokens", "chars_by_tokens", "with_tabs", "indent_tokens", "is_han"]
