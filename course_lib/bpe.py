"""Byte-level BPE written from scratch, for teaching (tested against the real tokenizer).

Byte-level BPE in three steps, as GPT-2, Llama 3, Qwen and SmolLM do it:

    text --pre-tokenize--> words --UTF-8 + bytes_to_unicode--> symbols --merges, lowest rank first--> tokens --vocab--> ids

`train_bpe` learns merges from a text: count adjacent symbol pairs, merge the most frequent, repeat.
`BPE` encodes with a vocabulary and merges learned elsewhere, e.g. the real model's (`BPE.from_gguf`).
Special tokens such as `<|im_start|>` are cut out of the text first and become one id each.
`course_lib.tokenizer` does the same job with the fast Rust `tokenizers` library.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator

import regex  # like `re`, plus Unicode classes: \p{L} (letters), \p{N} (numbers)

# GPT-2's split: English contractions, words (with their leading space), numbers, punctuation runs, spaces.
GPT2_SPLIT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
_ONE_DIGIT = regex.compile(r"\p{N}|[^\p{N}]+")


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each of the 256 byte values to a printable character.

    Printable Latin-1 bytes map to themselves; the rest (control bytes, space) are shifted to
    U+0100 and up, which is why a leading space shows up as 'Ġ' (U+0120) in the vocabulary.
    """
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    """The inverse of `bytes_to_unicode`: vocabulary character -> byte value."""
    return {c: b for b, c in bytes_to_unicode().items()}


def to_symbols(word: str) -> tuple[str, ...]:
    """A word as byte-level symbols: its UTF-8 bytes, each shown as one printable character."""
    table = bytes_to_unicode()
    return tuple(table[b] for b in word.encode("utf-8"))


def symbols_to_bytes(token: str) -> bytes:
    """A vocabulary entry ('Ġthe', 'ä½', ...) back to the raw bytes it stands for."""
    table = unicode_to_bytes()
    return bytes(table[c] for c in token)


# ----------------------------------------------------------------------------- pre-tokenizers

def gpt2_pre_tokenize(text: str) -> list[str]:
    """Split text into words with GPT-2's regex; BPE never merges across these boundaries."""
    return GPT2_SPLIT.findall(text)


def smollm_pre_tokenize(text: str) -> list[str]:
    """SmolLM's split: every digit on its own ('2024' -> '2','0','2','4'), then GPT-2's regex on the rest."""
    return [word for piece in _ONE_DIGIT.findall(text) for word in gpt2_pre_tokenize(piece)]


PRE_TOKENIZERS: dict[str, Callable[[str], list[str]]] = {"smollm": smollm_pre_tokenize, "gpt2": gpt2_pre_tokenize}


# ----------------------------------------------------------------------------- training

@dataclass
class MergeStep:
    """One round of training: the pair merged, how often it occurred, and the words afterwards."""

    rank: int  # 0 for the first merge learned
    pair: tuple[str, str]
    count: int
    words: dict[tuple[str, ...], int]  # each distinct word (as symbols) -> how many times it occurs

    @property
    def new_token(self) -> str:
        return self.pair[0] + self.pair[1]

    @property
    def num_tokens(self) -> int:
        """Length of the whole training text in tokens after this merge."""
        return sum(len(w) * n for w, n in self.words.items())


def count_pairs(words: dict[tuple[str, ...], int]) -> Counter:
    """How often each adjacent pair of symbols occurs, over all words (weighted by word count)."""
    pairs: Counter = Counter()
    for word, n in words.items():
        for pair in zip(word, word[1:]):
            pairs[pair] += n
    return pairs


def merge_pair(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    """Replace every occurrence of `pair` in `word` (left to right) by the merged symbol."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def bpe_training_steps(text: str, num_merges: int,
                       pre_tokenize: Callable[[str], list[str]] = gpt2_pre_tokenize) -> Iterator[MergeStep]:
    """Train byte-level BPE on `text`, yielding each merge as it is learned (to watch it happen).

    Each round merges the most frequent adjacent pair; a tie goes to the alphabetically smallest
    pair. Training stops early when no pair is left (every word is a single token).
    """
    words: dict[tuple[str, ...], int] = dict(Counter(to_symbols(w) for w in pre_tokenize(text)))
    for rank in range(num_merges):
        pairs = count_pairs(words)
        if not pairs:
            return
        pair, count = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))  # most frequent, then smallest
        words = {merge_pair(w, pair): n for w, n in words.items()}
        yield MergeStep(rank, pair, count, words)


def train_bpe(text: str, num_merges: int,
              pre_tokenize: Callable[[str], list[str]] = gpt2_pre_tokenize) -> list[tuple[str, str]]:
    """The merges (pairs of symbols, in the order learned) of a byte-level BPE trained on `text`."""
    return [step.pair for step in bpe_training_steps(text, num_merges, pre_tokenize)]


def vocab_from_merges(merges: list[tuple[str, str]]) -> dict[str, int]:
    """The 256 byte symbols (ids 0..255) followed by one new token per merge."""
    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    return vocab


# ----------------------------------------------------------------------------- encoding

class BPE:
    """Encode and decode with a byte-level BPE vocabulary and its merges.

    vocab:        token (in byte-level spelling, e.g. 'Ġthe') -> id
    merges:       pairs ('Ġ', 't') or strings 'Ġ t', earliest (highest priority) first
    pre_tokenize: text -> words (see `smollm_pre_tokenize`)
    special_tokens: strings matched whole in the text before anything else; each is one id
    """

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]] | list[str],
                 pre_tokenize: Callable[[str], list[str]] = gpt2_pre_tokenize,
                 special_tokens: list[str] | tuple[str, ...] = ()):
        self.vocab = dict(vocab)
        self.id_to_token = {i: t for t, i in self.vocab.items()}
        pairs = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]
        self.ranks: dict[tuple[str, str], int] = {p: r for r, p in enumerate(pairs)}
        self.pre_tokenize = pre_tokenize
        self.special_tokens = list(special_tokens)
        self.special_ids = {self.vocab[t] for t in self.special_tokens}
        # Longest first, so that at one position the longest special token wins.
        alternatives = "|".join(regex.escape(t) for t in sorted(self.special_tokens, key=len, reverse=True))
        self._special = regex.compile(f"({alternatives})") if alternatives else None
        self._cache: dict[str, tuple[str, ...]] = {}

    @classmethod
    def from_gguf(cls, path: str | Path | None = None) -> "BPE":
        """The vocabulary, merges, pre-tokenizer and special tokens stored in a GGUF file (default model if None)."""
        from .gguf_file import default_gguf_path, read_gguf_tokenizer_data

        data = read_gguf_tokenizer_data(path or default_gguf_path())
        if data["model"] != "gpt2":
            raise ValueError(f"only byte-level BPE (GGUF tokenizer model 'gpt2') is supported, not {data['model']!r}")
        if data["pre"] not in PRE_TOKENIZERS:
            raise ValueError(f"pre-tokenizer {data['pre']!r} not written here; known: {sorted(PRE_TOKENIZERS)}")
        vocab = {tok: i for i, tok in enumerate(data["tokens"])}
        special = [t for t, kind in zip(data["tokens"], data["token_type"]) if kind == 3]  # 3 = CONTROL
        return cls(vocab, data["merges"], PRE_TOKENIZERS[data["pre"]], special)

    def bpe(self, word: str, trace: list | None = None) -> tuple[str, ...]:
        """Split one pre-tokenized word into tokens: start from bytes, apply the best-ranked merge until none applies.

        If `trace` is a list, each intermediate split is appended to it (to watch the merges).
        A byte the vocabulary lacks (a few control bytes never seen in training) is dropped,
        as the `tokenizers` library does when there is no unknown-token.
        """
        if trace is None and word in self._cache:
            return self._cache[word]
        symbols = tuple(s for s in to_symbols(word) if s in self.vocab)
        if trace is not None:
            trace.append(symbols)
        while len(symbols) > 1:
            ranked = [(self.ranks.get(pair, float("inf")), pair) for pair in zip(symbols, symbols[1:])]
            rank, pair = min(ranked)
            if rank == float("inf"):
                break  # no adjacent pair was ever merged in training
            symbols = merge_pair(symbols, pair)
            if trace is not None:
                trace.append(symbols)
        self._cache[word] = symbols
        return symbols

    def split_special(self, text: str) -> list[tuple[str, bool]]:
        """Cut text into (chunk, is_special) pieces around the special tokens it contains."""
        if self._special is None:
            return [(text, False)] if text else []
        return [(piece, i % 2 == 1) for i, piece in enumerate(self._special.split(text)) if piece]

    def tokenize(self, text: str) -> list[str]:
        """Text -> tokens in the vocabulary's spelling."""
        tokens: list[str] = []
        for chunk, is_special in self.split_special(text):
            if is_special:
                tokens.append(chunk)
            else:
                for word in self.pre_tokenize(chunk):
                    tokens.extend(self.bpe(word))
        return tokens

    def encode(self, text: str) -> list[int]:
        """Text -> token ids."""
        return [self.vocab[t] for t in self.tokenize(text)]

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (a special token: its text)."""
        token = self.id_to_token[token_id]
        return token.encode("utf-8") if token_id in self.special_ids else symbols_to_bytes(token)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Ids -> text: join the tokens' bytes, then read them as UTF-8 (an incomplete character becomes U+FFFD)."""
        data = b"".join(self.token_bytes(i) for i in ids if not (skip_special_tokens and i in self.special_ids))
        return data.decode("utf-8", errors="replace")
