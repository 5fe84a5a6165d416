"""Text <-> token ids through the `tokenizers` library, from tokenizer.json or a GGUF header.

A GGUF file carries its vocabulary as ``tokenizer.ggml.*`` fields; both styles llama.cpp
writes are rebuilt as a `tokenizers.Tokenizer`:

* ``gpt2`` (byte-level BPE): tokens + merges, with the pre-tokenizer regex named by
  ``tokenizer.ggml.pre`` (llama3 and qwen2 splits, GPT-2's otherwise).
* ``llama`` (SentencePiece BPE): tokens + scores. Merges are derived from the scores the way
  Hugging Face's converter does (every split of a piece into two known pieces, ranked by the
  merged piece's score), with byte fallback to the ``<0xNN>`` tokens and a leading ``▁``.

`IncrementalDetokenizer` turns a stream of ids into text pieces that never split a UTF-8
character, by re-decoding a short window and holding back text ending in U+FFFD.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rlx_lm.errors import UnsupportedError, WeightFormatError

__all__ = ["IncrementalDetokenizer", "Tokenizer"]

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Pre-tokenizer names whose tokenizer.json sets ignore_merges (whole-word vocabulary hits win).
_IGNORE_MERGES = ("llama3", "llama-v3", "llama-bpe", "smaug-bpe")
_PRE_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}

# llama.cpp token types (gguf.TokenType).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


class Tokenizer:
    """A `tokenizers.Tokenizer` with the model's BOS/EOS ids and an incremental decoder."""

    def __init__(
        self,
        inner: Any,
        *,
        bos_id: int | None = None,
        eos_ids: Iterable[int] = (),
        source: str = "",
    ) -> None:
        self.inner = inner
        self.bos_id = bos_id
        self.eos_ids = frozenset(int(t) for t in eos_ids)
        self.source = source

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """The tokenizer of a model: embedded in a GGUF file, or tokenizer.json beside weights."""
        p = Path(path)
        if p.is_file() and p.suffix != ".json":
            with p.open("rb") as fh:
                magic = fh.read(4)
            if magic == b"GGUF":
                return cls.from_gguf(p)
            p = p.parent
        if p.is_dir():
            return cls.from_dir(p)
        if p.is_file():
            return cls.from_file(p)
        raise WeightFormatError(f"{p}: no such file or directory")

    @classmethod
    def from_file(cls, path: str | Path, *, bos_id: int | None = None) -> Tokenizer:
        """Load a ``tokenizer.json``."""
        from tokenizers import Tokenizer as HfTokenizer

        p = Path(path)
        try:
            inner = HfTokenizer.from_file(str(p))
        except Exception as exc:
            raise WeightFormatError(f"{p}: unreadable tokenizer.json: {exc}") from None
        return cls(inner, bos_id=bos_id, source=str(p))

    @classmethod
    def from_dir(cls, directory: str | Path) -> Tokenizer:
        """Load ``tokenizer.json`` from a model directory, with BOS/EOS from its config files."""
        d = Path(directory)
        tj = d / "tokenizer.json"
        if not tj.is_file():
            raise WeightFormatError(f"{d}: no tokenizer.json in the model directory")
        tok = cls.from_file(tj)
        meta: dict[str, Any] = {}
        for name in ("config.json", "tokenizer_config.json", "generation_config.json"):
            f = d / name
            if f.is_file():
                try:
                    data = json.loads(f.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
                if isinstance(data, dict):
                    meta.update({k: v for k, v in data.items() if v is not None})
        tok.bos_id = _token_id(meta.get("bos_token_id"), meta.get("bos_token"), tok.inner)
        eos = meta.get("eos_token_id")
        ids: list[int] = []
        if isinstance(eos, list):
            ids = [int(x) for x in eos]
        else:
            one = _token_id(eos, meta.get("eos_token"), tok.inner)
            ids = [one] if one is not None else []
        tok.eos_ids = frozenset(ids)
        return tok

    @classmethod
    def from_gguf(cls, path: str | Path) -> Tokenizer:
        """Rebuild the tokenizer a GGUF file embeds (``gpt2`` BPE or ``llama`` SentencePiece)."""
        from rlx_lm.runners.gguf_loader import open_gguf

        g = open_gguf(path)
        model = g.field("tokenizer.ggml.model")
        tokens = g.field("tokenizer.ggml.tokens")
        if model is None or not tokens:
            raise WeightFormatError(f"{path}: the GGUF file embeds no tokenizer")
        types = g.field("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
        if model == "gpt2":
            merges = g.field("tokenizer.ggml.merges") or []
            inner = _gpt2_tokenizer(tokens, merges, types, str(g.field("tokenizer.ggml.pre") or ""))
            default_bos = False
        elif model == "llama":
            scores = g.field("tokenizer.ggml.scores") or [0.0] * len(tokens)
            space_prefix = g.field("tokenizer.ggml.add_space_prefix")
            inner = _spm_tokenizer(
                tokens,
                scores,
                types,
                space_prefix=True if space_prefix is None else bool(space_prefix),
            )
            default_bos = True
        else:
            raise UnsupportedError(
                f"{path}: tokenizer model {model!r} is not supported (supported: gpt2, llama)"
            )
        bos = g.field("tokenizer.ggml.bos_token_id")
        eos = g.field("tokenizer.ggml.eos_token_id")
        eot = g.field("tokenizer.ggml.eot_token_id")
        add_bos = g.field("tokenizer.ggml.add_bos_token")
        add_bos = default_bos if add_bos is None else bool(add_bos)
        if add_bos and bos is not None:
            from tokenizers.processors import TemplateProcessing

            bos_tok = tokens[int(bos)]
            inner.post_processor = TemplateProcessing(
                single=f"{bos_tok} $A",
                pair=f"{bos_tok} $A $B",
                special_tokens=[(bos_tok, int(bos))],
            )
        eos_ids = [int(t) for t in (eos, eot) if t is not None]
        return cls(
            inner, bos_id=None if bos is None else int(bos), eos_ids=eos_ids, source=str(path)
        )

    # --------------------------------------------------------------------- use

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return int(self.inner.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (with BOS when the model adds one and ``add_special_tokens``)."""
        return list(self.inner.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``."""
        return str(self.inner.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def is_eos(self, token: int) -> bool:
        """Whether ``token`` ends generation."""
        return token in self.eos_ids

    def detokenizer(self, context: Sequence[int] = ()) -> IncrementalDetokenizer:
        """A streaming decoder; ``context`` (the prompt's tail) fixes spacing of the first piece."""
        return IncrementalDetokenizer(self, context)


class IncrementalDetokenizer:
    """Turns ids, one at a time, into text pieces that never end inside a UTF-8 character."""

    #: Prompt tokens kept as left context, enough for any decoder's spacing rules.
    CONTEXT = 6

    def __init__(self, tokenizer: Tokenizer, context: Sequence[int] = ()) -> None:
        self._tok = tokenizer
        self._ids: list[int] = list(context)[-self.CONTEXT :]
        self._prefix = 0
        self._read = len(self._ids)

    def push(self, token: int) -> str:
        """Add ``token``; return the text it completes ("" while a character is incomplete)."""
        self._ids.append(int(token))
        before = self._tok.decode(self._ids[self._prefix : self._read])
        after = self._tok.decode(self._ids[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character decodes as U+FFFD)."""
        before = self._tok.decode(self._ids[self._prefix : self._read])
        after = self._tok.decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return after[len(before) :] if len(after) > len(before) else ""


def _token_id(value: Any, token: Any, inner: Any) -> int | None:
    if isinstance(value, int):
        return value
    if isinstance(token, dict):
        token = token.get("content")
    if isinstance(token, str):
        found = inner.token_to_id(token)
        return None if found is None else int(found)
    return None


def _specials(tokens: Sequence[str], types: Sequence[int]) -> list[Any]:
    from tokenizers import AddedToken

    return [
        AddedToken(t, special=ty == _CONTROL, normalized=False)
        for t, ty in zip(tokens, types, strict=False)
        if ty in (_CONTROL, _USER_DEFINED)
    ]


def _gpt2_tokenizer(
    tokens: Sequence[str], merges: Sequence[str], types: Sequence[int], pre: str
) -> Any:
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as HfTokenizer

    vocab = {t: i for i, t in enumerate(tokens)}
    split = _PRE_SPLITS.get(pre)
    pairs = []
    for m in merges:
        left, sep, right = m.partition(" ")
        if not sep:
            raise WeightFormatError(f"malformed merge {m!r} in tokenizer.ggml.merges")
        pairs.append((left, right))
    inner = HfTokenizer(models.BPE(vocab, pairs, ignore_merges=pre in _IGNORE_MERGES))
    if split is _QWEN2_SPLIT:
        inner.normalizer = normalizers.NFC()
    if split is None:
        inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        inner.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    inner.decoder = decoders.ByteLevel()
    inner.add_special_tokens(_specials(tokens, types))
    return inner


def _spm_tokenizer(
    tokens: Sequence[str], scores: Sequence[float], types: Sequence[int], *, space_prefix: bool
) -> Any:
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, models, normalizers

    vocab = {t: i for i, t in enumerate(tokens)}
    mergeable = {
        t: float(s)
        for t, s, ty in zip(tokens, scores, types, strict=False)
        if ty in (_NORMAL, _USER_DEFINED) and len(t) > 1
    }
    ranked: list[tuple[float, int, int, str, str]] = []
    for piece, score in mergeable.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-score, vocab[left], vocab[right], left, right))
    ranked.sort()
    unk = next((t for t, ty in zip(tokens, types, strict=False) if ty == _UNKNOWN), None)
    inner = HfTokenizer(
        models.BPE(
            vocab,
            [(left, right) for *_, left, right in ranked],
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    prepend = [normalizers.Prepend("\u2581")] if space_prefix else []
    inner.normalizer = normalizers.Sequence([*prepend, normalizers.Replace(" ", "\u2581")])
    strip = [decoders.Strip(" ", 1, 0)] if space_prefix else []
    inner.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
    )
    inner.add_special_tokens(_specials(tokens, types))
    return inner
