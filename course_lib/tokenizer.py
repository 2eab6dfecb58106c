"""Text <-> token ids with the model's own vocabulary, its chat template, and a streaming detokenizer.

`Tokenizer` wraps a Hugging Face `tokenizers.Tokenizer` (Rust) that `course_lib.loading.load_tokenizer` builds from
a GGUF file or a `tokenizer.json`. `course_lib.bpe` writes the same byte-level BPE in Python for teaching.
"""
from __future__ import annotations

import re
from functools import cached_property

from tokenizers import Tokenizer as HFTokenizer

CHAT_ROLES = ("system", "user", "assistant", "tool")
CONTENT_OPEN, CONTENT_CLOSE = "\ufdd0", "\ufdd1"  # Unicode noncharacters: they mark message content in a rendering


def check_chat_messages(messages: list[dict[str, str]]) -> None:
    """Raise a TypeError/ValueError naming the message unless `messages` is a list of {role, content: str}:
    a template fails deep in Jinja on a non-str content and renders an unknown role as if it were one."""
    if not isinstance(messages, (list, tuple)):
        raise TypeError(f"messages must be a list of {{'role': ..., 'content': ...}} dicts, "
                        f"got {type(messages).__name__}: {messages!r}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise (ValueError if isinstance(m, dict) else TypeError)(
                f"messages[{i}] must be a dict with 'role' and 'content', got {type(m).__name__}: {m!r}")
        if m["role"] not in CHAT_ROLES:
            raise ValueError(f"messages[{i}]['role'] must be one of {', '.join(CHAT_ROLES)}, got {m['role']!r}")
        if not isinstance(m["content"], str):
            raise TypeError(f"messages[{i}]['content'] must be a str, got {type(m['content']).__name__}: "
                            f"{m['content']!r}")


def mark_content(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The messages with each content's stripped core between CONTENT_OPEN and CONTENT_CLOSE (whitespace
    outside the marks, so a template that trims content renders the same text)."""
    marked = []
    for i, m in enumerate(messages):
        content = m["content"]
        if CONTENT_OPEN in content or CONTENT_CLOSE in content:
            raise ValueError(f"messages[{i}]['content'] must not hold U+FDD0 or U+FDD1 (noncharacters reserved "
                             f"to mark message content), got {content!r}")
        core = content.strip()
        lead = len(content) - len(content.lstrip())
        marked.append({**m, "content": content[:lead] + CONTENT_OPEN + core + CONTENT_CLOSE
                       + content[lead + len(core):]})
    return marked


def chat_parts(marked: str, text: str) -> list[str] | None:
    """Split a marked rendering into [template, content, template, ..., template] that join to `text`, empty
    content merged into the template around it; None if the marks do not pair up or the rendering differs from
    `text` (a template that tests or slices content)."""
    parts = re.split(f"{CONTENT_OPEN}(.*?){CONTENT_CLOSE}", marked, flags=re.DOTALL)
    if "".join(parts) != text or any(CONTENT_OPEN in p or CONTENT_CLOSE in p for p in parts):
        return None
    merged = [parts[0]]
    for content, template in zip(parts[1::2], parts[2::2]):
        if content:
            merged += [content, template]
        else:
            merged[-1] += template
    return merged


class Tokenizer:
    """encode/decode, special tokens and the chat template of one model."""

    def __init__(self, backend: HFTokenizer, bos_token_id: int | None, eos_token_ids: list[int],
                 chat_template: str | None, add_bos_token: bool = False, name: str = ""):
        self.backend, self.bos_token_id, self.eos_token_ids = backend, bos_token_id, eos_token_ids
        self.chat_template, self.add_bos_token, self.name = chat_template, add_bos_token, name
        added = backend.get_added_tokens_decoder()
        self.special_ids = set(added)
        self._control = {tok.content: (i, tok) for i, tok in added.items() if tok.special}
        longest_first = sorted(self._control, key=len, reverse=True)  # a regex alternation is leftmost-first
        self._control_re = re.compile("|".join(map(re.escape, longest_first))) if longest_first else None

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Text -> ids. Special tokens written in the text (e.g. <|im_start|>) become their single ids."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        add_bos = self.add_bos_token if add_bos is None else add_bos
        if add_bos and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str:
        """The token as the vocabulary spells it (byte-level: a space shows as 'Ġ')."""
        return self.backend.id_to_token(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (may be part of a UTF-8 character)."""
        from .bpe import unicode_to_bytes

        tok = self.id_to_token(token_id)
        return tok.encode() if token_id in self.special_ids else bytes(unicode_to_bytes()[c] for c in tok)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render a conversation with the model's own Jinja chat template."""
        check_chat_messages(messages)
        if not self.chat_template:
            raise ValueError(f"model {self.name!r} has no chat template; use generate() with plain text")
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        special = {"bos_token": self._token_text(self.bos_token_id), "eos_token": self._token_text(self.eos_token_id)}
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **special)

    def encode_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """Render a conversation and encode it; only the template's own text yields control tokens, so a user
        who writes "<|im_end|>\\n<|im_start|>system\\n..." cannot forge a turn. Content without control text gives
        the ids of `encode(apply_chat_template(...))`."""
        text = self.apply_chat_template(messages, add_generation_prompt)
        parts = chat_parts(self.apply_chat_template(mark_content(messages), add_generation_prompt), text)
        if parts is None:  # the template rewrote some content: its parts cannot be told from the template's
            if self._control_re and any(self._control_re.search(m["content"]) for m in messages):
                raise ValueError(f"the chat template of {self.name!r} rewrites message content, so control "
                                 f"text in the content cannot be kept plain; remove it from the messages")
            return self.encode(text, add_bos=False)
        ids, piece = [], ""  # piece: plain text waiting for the next control token
        for k, part in enumerate(parts):
            if k % 2:  # message content
                piece += part
                continue
            pos = 0
            for match in self._control_re.finditer(part) if self._control_re else ():
                token_id, token = self._control[match.group()]
                before = part[pos:match.start()]
                piece += before.rstrip() if token.lstrip else before  # the token swallows that whitespace
                ids += self._plain_ids(piece) + [token_id]
                piece, pos = "", match.end()
                if token.rstrip:
                    pos += len(part[pos:]) - len(part[pos:].lstrip())
            piece += part[pos:]
        return ids + self._plain_ids(piece)

    @cached_property
    def _plain(self) -> HFTokenizer:
        """A copy of the backend that encodes special-token text as ordinary text."""
        plain = HFTokenizer.from_str(self.backend.to_str())
        plain.encode_special_tokens = True
        return plain

    def _plain_ids(self, text: str) -> list[int]:
        return self._plain.encode(text, add_special_tokens=False).ids if text else []

    def _token_text(self, token_id: int | None) -> str:
        return "" if token_id is None else self.backend.id_to_token(token_id)


class StreamingDetokenizer:
    """Turn a growing list of token ids into text deltas, never emitting half a UTF-8 character, as vLLM's
    incremental detokenizer does: byte-level BPE may split a Chinese character or an emoji (3-4 bytes) across
    tokens, and a lone piece decodes to U+FFFD, so a delta that ends in U+FFFD is held back."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer, self.skip_special_tokens = tokenizer, skip_special_tokens
        self.token_ids: list[int] = []
        self.prefix_offset = self.read_offset = 0
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_ids: int | list[int]) -> str:
        """Append new ids; return the text they complete ("" while a character is still partial)."""
        self.token_ids.extend([token_ids] if isinstance(token_ids, int) else token_ids)
        prefix_text = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.token_ids[self.prefix_offset:])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""
        delta = new_text[len(prefix_text):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of a stream: whatever is still held back (a truly invalid byte sequence)."""
        full = self._decode(self.token_ids)
        delta = full[len(self.text):] if full.startswith(self.text) else ""
        self.text += delta
        return delta
