"""Text <-> token ids through the `tokenizers` library, from tokenizer.json or a GGUF header.

A GGUF file carries its vocabulary as ``tokenizer.ggml.*`` fields; both styles llama.cpp
writes are rebuilt as a `tokenizers.Tokenizer`:

* ``gpt2`` (byte-level BPE): tokens + merges, with the pre-tokenizer named by
  ``tokenizer.ggml.pre`` (every name llama.cpp knows whose regexes `rlx_lm.pre_tokenizers`
  reproduces; an unknown name is refused, ``pre_tokenizer=`` overrides it).
* ``llama`` (SentencePiece BPE): tokens + scores. Merges are derived from the scores the way
  Hugging Face's converter does (every split of a piece into two known pieces, ranked by the
  merged piece's score), with byte fallback to the ``<0xNN>`` tokens and a leading ``▁``.

`IncrementalDetokenizer` turns a stream of ids into text pieces that never split a UTF-8
character, by re-decoding a short window and holding back text ending in U+FFFD.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from rlx_lm._core import spm_merges
from rlx_lm.errors import ChatTemplateError, UnsupportedError, WeightFormatError

if TYPE_CHECKING:
    from rlx_lm.chat_template import ChatTemplate, ChatTemplates
    from rlx_lm.pre_tokenizers import PreTokenizerSpec

__all__ = ["IncrementalDetokenizer", "Tokenizer"]

# llama.cpp token types (gguf.TokenType).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

#: The GGUF metadata arrays a tokenizer is built from.
GGUF_TOKENIZER_ARRAYS = (
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
)
# Token texts llama.cpp treats as end of generation whenever the vocabulary has them.
_EOG_TEXTS = frozenset(
    (
        "<|eot_id|>",
        "<|eom_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|end_of_text|>",
        "<EOT>",
        "_<EOT>",
        "<\uff5cend\u2581of\u2581sentence\uff5c>",  # DeepSeek's, with full-width bars
        "<|END_OF_TURN_TOKEN|>",
        "<end_of_utterance>",
        "<|return|>",
        "<|call|>",
    )
)
# OpenAI's harmony format (gpt-oss): ``<|end|>`` closes a message the model goes on from (its
# reasoning, before the final answer); ``<|return|>`` and ``<|call|>`` end its turn. llama.cpp
# drops ``<|end|>`` from the end-of-generation tokens of a vocabulary that has both of those.
_HARMONY_EOG = ("<|return|>", "<|call|>")


# Harmony's message markup, control tokens that llama.cpp renders in the output text anyway
# (so that a reply's channels can be told apart: rlx_lm.reasoning).
_HARMONY_MARKUP = frozenset(("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"))


# Mistral's tool-call markup, control tokens llama-server keeps in a reply to a request with
# tools (its "preserved tokens"): rendered so that rlx_lm.tool_calls can find the calls.
_TOOL_MARKUP = frozenset(("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"))


def _harmony(texts: Any) -> bool:
    """Whether a vocabulary (token texts, ``in``-testable) is harmony's."""
    return all(t in texts for t in _HARMONY_EOG)


class Tokenizer:
    """A `tokenizers.Tokenizer` with the model's BOS/EOS ids and an incremental decoder."""

    def __init__(
        self,
        inner: Any,
        *,
        bos_id: int | None = None,
        eos_ids: Iterable[int] = (),
        eot_ids: Iterable[int] = (),
        source: str = "",
        chat_templates: ChatTemplates | None = None,
        special_tokens: Mapping[str, str] | None = None,
        add_bos: bool | None = None,
    ) -> None:
        self.inner = inner
        self.bos_id = bos_id
        self.eos_ids = frozenset(int(t) for t in eos_ids)
        self.source = source
        self._eot_ids = frozenset(int(t) for t in eot_ids)
        self._chat_templates = chat_templates
        self._special_tokens = dict(special_tokens or {})
        self._add_bos = add_bos
        self._template_stops: frozenset[int] | None = None
        self._stop_cache: tuple[frozenset[int], frozenset[int]] | None = None
        self._containing: dict[tuple[str, ...], tuple[int, ...]] = {}

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(cls, path: str | Path, *, pre_tokenizer: str | None = None) -> Tokenizer:
        """The tokenizer of a model: embedded in a GGUF file, or tokenizer.json beside weights.

        ``pre_tokenizer`` names the split of a GGUF BPE vocabulary (a ``tokenizer.ggml.pre``
        value, see `rlx_lm.pre_tokenizers`) in place of the one the file names.
        """
        p = Path(path)
        if p.is_file() and p.suffix != ".json":
            with p.open("rb") as fh:
                magic = fh.read(4)
            if magic == b"GGUF":
                return cls.from_gguf(p, pre_tokenizer=pre_tokenizer)
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
        """Load ``tokenizer.json`` from a model directory, with BOS/EOS from its config files.

        The chat template comes from ``chat_template.jinja`` or ``tokenizer_config.json``.
        """
        from rlx_lm.chat_template import ChatTemplates, templates_from_tokenizer_config

        d = Path(directory)
        tj = d / "tokenizer.json"
        if not tj.is_file():
            raise WeightFormatError(f"{d}: no tokenizer.json in the model directory")
        tok = cls.from_file(tj)
        meta: dict[str, Any] = {}
        tok_config: dict[str, Any] = {}
        for name in ("config.json", "tokenizer_config.json", "generation_config.json"):
            f = d / name
            if f.is_file():
                try:
                    data = json.loads(f.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
                if isinstance(data, dict):
                    meta.update({k: v for k, v in data.items() if v is not None})
                    if name == "tokenizer_config.json":
                        tok_config = data
        tok.bos_id = _token_id(meta.get("bos_token_id"), meta.get("bos_token"), tok.inner)
        eos = meta.get("eos_token_id")
        ids: list[int] = []
        if isinstance(eos, list):
            ids = [int(x) for x in eos]
        else:
            one = _token_id(eos, meta.get("eos_token"), tok.inner)
            ids = [one] if one is not None else []
        tok.eos_ids = frozenset(ids)
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            text = _token_text(tok_config.get(key))
            if text is not None:
                tok._special_tokens[key] = text
        try:
            tok._chat_templates = templates_from_tokenizer_config(
                tok_config, where=str(d), jinja_file=d / "chat_template.jinja"
            )
        except ChatTemplateError as exc:
            tok._chat_templates = ChatTemplates(error=str(exc))
        return tok

    @classmethod
    def from_gguf(cls, path: str | Path, *, pre_tokenizer: str | None = None) -> Tokenizer:
        """Rebuild the tokenizer a GGUF file embeds (``gpt2`` BPE or ``llama`` SentencePiece).

        The header is read once, through the bounds-checked walker (`rlx_lm._headers`). A BPE
        vocabulary's ``tokenizer.ggml.pre`` must be a name `rlx_lm.pre_tokenizers` knows
        (`UnsupportedError` otherwise), unless ``pre_tokenizer`` names one.
        """
        from rlx_lm._headers import read_gguf_header
        from rlx_lm.chat_template import ChatTemplates, templates_from_gguf_metadata

        header = read_gguf_header(Path(path), arrays=GGUF_TOKENIZER_ARRAYS)
        meta, arrays = header.metadata, header.arrays
        model = meta.get("tokenizer.ggml.model")
        tokens: list[str] = arrays.get("tokenizer.ggml.tokens") or []
        if model is None or not tokens:
            raise WeightFormatError(f"{path}: the GGUF file embeds no tokenizer")
        if not isinstance(tokens, list):
            raise WeightFormatError(f"{path}: tokenizer.ggml.tokens must be an array of strings")
        n = len(tokens)
        types = _int_list(arrays.get("tokenizer.ggml.token_type"), n, path, "token_type")
        if types is None:
            types = [_NORMAL] * n
        if model == "gpt2":
            merges = arrays.get("tokenizer.ggml.merges") or []
            if not isinstance(merges, list):
                raise WeightFormatError(f"{path}: tokenizer.ggml.merges must be strings")
            spec = _pre_spec(meta.get("tokenizer.ggml.pre"), pre_tokenizer, path)
            inner = _gpt2_tokenizer(tokens, merges, types, spec, path)
            default_bos = bool(spec.add_bos)
        elif model == "llama":
            raw_scores = arrays.get("tokenizer.ggml.scores")
            scores = [0.0] * n if raw_scores is None else [float(x) for x in raw_scores]
            if len(scores) < n:
                raise WeightFormatError(
                    f"{path}: tokenizer.ggml.scores has fewer items than tokens"
                )
            space_prefix = meta.get("tokenizer.ggml.add_space_prefix")
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
        bos = _token_index(meta.get("tokenizer.ggml.bos_token_id"), n)
        if model == "gpt2" and spec.no_bos:
            bos = None
        eos = _token_index(meta.get("tokenizer.ggml.eos_token_id"), n)
        eots = [
            t
            for t in (
                _token_index(meta.get("tokenizer.ggml.eot_token_id"), n),
                _token_index(meta.get("tokenizer.ggml.eom_token_id"), n),
            )
            if t is not None
        ]
        eog_texts = _EOG_TEXTS - {"<|end|>"} if _harmony(set(tokens)) else _EOG_TEXTS
        eots += [i for i, ty in enumerate(types) if ty == _CONTROL and tokens[i] in eog_texts]
        add_bos = meta.get("tokenizer.ggml.add_bos_token")
        add_bos = default_bos if add_bos is None else bool(add_bos)
        if add_bos and bos is not None:
            from tokenizers.processors import TemplateProcessing

            bos_tok = tokens[bos]
            inner.post_processor = TemplateProcessing(
                single=f"{bos_tok} $A",
                pair=f"{bos_tok} $A $B",
                special_tokens=[(bos_tok, bos)],
            )
        special: dict[str, str] = {}
        for key, field in (
            ("bos_token", "bos"),
            ("eos_token", "eos"),
            ("unk_token", "unknown"),
            ("pad_token", "padding"),
        ):
            idx = _token_index(meta.get(f"tokenizer.ggml.{field}_token_id"), n)
            if idx is not None:
                special[key] = tokens[idx]
        try:
            templates = templates_from_gguf_metadata(meta, where=str(path))
        except ChatTemplateError as exc:
            templates = ChatTemplates(error=str(exc))
        return cls(
            inner,
            bos_id=bos,
            eos_ids=[t for t in (eos,) if t is not None],
            eot_ids=eots,
            source=str(path),
            chat_templates=templates,
            special_tokens=special,
            add_bos=add_bos and bos is not None,
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

    def ids_containing(self, texts: Iterable[str]) -> tuple[int, ...]:
        """The ids, sorted, of every token whose text holds one of ``texts``, and of the
        tokens each text encodes to on its own: llama.cpp's reading of DRY's sequence
        breaker strings (``"\\n"`` breaks at every token with a newline in it, ``".\\n"`` as
        well as ``"\\n\\n"``) for single tokens. Empty strings match nothing."""
        wanted = tuple(dict.fromkeys(t for t in texts if t))
        if not wanted:
            return ()
        if wanted not in self._containing:  # a vocabulary scan: ~50 ms for 49k tokens
            pieces = self.inner.decode_batch(
                [[i] for i in range(self.vocab_size)], skip_special_tokens=False
            )
            out = {i for i, piece in enumerate(pieces) if any(t in piece for t in wanted)}
            for t in wanted:
                out.update(self.encode(t, add_special_tokens=False))
            self._containing[wanted] = tuple(sorted(out))
        return self._containing[wanted]

    def is_eos(self, token: int) -> bool:
        """Whether ``token`` ends generation: EOS or an end-of-turn token (`stop_token_ids`)."""
        return token in self.stop_token_ids

    # -------------------------------------------------------------------- chat

    @property
    def stop_token_ids(self) -> frozenset[int]:
        """Ids that end generation: EOS, end-of-turn tokens, and the chat template's marker.

        End-of-turn tokens are GGUF ``tokenizer.ggml.eot_token_id`` / ``eom_token_id``, the
        control tokens llama.cpp treats as end of generation (``<|im_end|>``,
        ``<|eot_id|>``, ``<end_of_turn>``, ...), and the special token the default chat
        template writes right after an assistant message.
        """
        if self._template_stops is None:
            self._template_stops = self._template_stop_ids()
        cached = self._stop_cache
        if cached is None or cached[0] is not self.eos_ids:
            cached = (self.eos_ids, self.eos_ids | self._eot_ids | self._template_stops)
            self._stop_cache = cached
        return cached[1]

    @property
    def chat_templates(self) -> ChatTemplates:
        """The model's chat templates (empty when it ships none)."""
        from rlx_lm.chat_template import ChatTemplates

        if self._chat_templates is None:
            self._chat_templates = ChatTemplates()
        return self._chat_templates

    @property
    def chat_template(self) -> ChatTemplate | None:
        """The default chat template, or None when the model has none."""
        templates = self.chat_templates
        return templates.select() if templates.has_default() else None

    @property
    def special_tokens(self) -> dict[str, str]:
        """``bos_token``, ``eos_token``, ... as text, the variables templates read."""
        return dict(self._special_tokens)

    def set_chat_template(self, template: str | Path | ChatTemplate) -> None:
        """Use ``template`` (Jinja text, a file, or a `ChatTemplate`) as the default one."""
        from rlx_lm.chat_template import ChatTemplate

        if isinstance(template, Path):
            template = ChatTemplate.from_file(template)
        elif isinstance(template, str):
            template = ChatTemplate(template)
        self._chat_templates = self.chat_templates.with_default(template)
        self._template_stops = None
        self._stop_cache = None

    @overload
    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = ...,
        tokenize: Literal[True] = ...,
        *,
        tools: Sequence[Mapping[str, Any]] | None = ...,
        chat_template: str | Path | ChatTemplate | None = ...,
        **kwargs: Any,
    ) -> list[int]: ...

    @overload
    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = ...,
        *,
        tokenize: Literal[False],
        tools: Sequence[Mapping[str, Any]] | None = ...,
        chat_template: str | Path | ChatTemplate | None = ...,
        **kwargs: Any,
    ) -> str: ...

    @overload
    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = ...,
        tokenize: bool = ...,
        *,
        tools: Sequence[Mapping[str, Any]] | None = ...,
        chat_template: str | Path | ChatTemplate | None = ...,
        **kwargs: Any,
    ) -> list[int] | str: ...

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tokenize: bool = True,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | Path | ChatTemplate | None = None,
        **kwargs: Any,
    ) -> list[int] | str:
        """Render ``messages`` with the chat template; token ids when ``tokenize`` else text.

        As Hugging Face's method: ``chat_template`` names one of the model's templates
        (``"tool_use"``) or is template text (or a `Path` to a file, or a `ChatTemplate`);
        None picks the model's (``tool_use`` when ``tools`` are given and it has one).
        ``documents``, ``continue_final_message`` and any other keyword reach the template.
        The text is tokenized without adding special tokens, except that a BOS the
        tokenizer would add is put first when the template did not write it (as llama.cpp
        does), so the prompt never lacks, nor doubles, its BOS.
        """
        template = self._resolve_template(chat_template, tools=tools is not None)
        documents = kwargs.pop("documents", None)
        continue_final = bool(kwargs.pop("continue_final_message", False))
        text = template.render(
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final,
            tools=tools,
            documents=documents,
            special_tokens=self._special_tokens,
            **kwargs,
        )
        if not tokenize:
            return text
        ids = self.encode(text, add_special_tokens=False)
        if self._adds_bos() and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids.insert(0, self.bos_id)
        return ids

    def _resolve_template(
        self, chat_template: str | Path | ChatTemplate | None, *, tools: bool
    ) -> ChatTemplate:
        from rlx_lm.chat_template import ChatTemplate

        if isinstance(chat_template, ChatTemplate):
            return chat_template
        if isinstance(chat_template, Path):
            return ChatTemplate.from_file(chat_template)
        templates = self.chat_templates
        if chat_template is None:
            return templates.select(tools=tools)
        if chat_template in templates.names():
            return templates.select(chat_template)
        return ChatTemplate(chat_template)

    def _adds_bos(self) -> bool:
        if self._add_bos is None:
            ids = self.encode("a", add_special_tokens=True)
            self._add_bos = bool(ids) and self.bos_id is not None and ids[0] == self.bos_id
        return self._add_bos

    def _template_stop_ids(self) -> frozenset[int]:
        """The special token the default template writes right after an assistant turn."""
        templates = self._chat_templates
        if templates is None or not templates.has_default():
            return frozenset()
        try:
            tail = templates.select().end_of_turn_text(self._special_tokens).lstrip()
        except ChatTemplateError:
            return frozenset()
        if not tail:
            return frozenset()
        best: tuple[int, int] | None = None
        added_tokens = self._added_tokens()
        for tid, added in added_tokens.items():
            if added and tail.startswith(added) and (best is None or len(added) > best[0]):
                best = (len(added), tid)
        if (
            best is not None
            and added_tokens[best[1]] == "<|end|>"
            and _harmony(set(added_tokens.values()))
        ):
            # A harmony template closes every message with <|end|>, the model's reasoning
            # too: its turn ends at <|return|> or <|call|> (end-of-turn tokens already).
            return frozenset()
        return frozenset() if best is None else frozenset((best[1],))

    def _added_tokens(self) -> dict[int, str]:
        getter = getattr(self.inner, "get_added_tokens_decoder", None)
        if getter is None:
            return {}
        return {int(i): str(t.content) for i, t in getter().items()}

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


def _token_text(token: Any) -> str | None:
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def _token_index(value: Any, n: int) -> int | None:
    """A GGUF token id field, or None when absent or outside the vocabulary."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
        return None
    return int(value)


def _int_list(value: Any, n: int, path: str | Path, what: str) -> list[int] | None:
    if value is None:
        return None
    if (
        isinstance(value, list)
        or getattr(value, "dtype", None) is None
        or value.dtype.kind not in "iu"
    ):
        raise WeightFormatError(f"{path}: tokenizer.ggml.{what} must be an integer array")
    if len(value) < n:
        raise WeightFormatError(f"{path}: tokenizer.ggml.{what} has fewer items than tokens")
    return [int(x) for x in value[:n].tolist()]


def _token_id(value: Any, token: Any, inner: Any) -> int | None:
    if isinstance(value, int):
        return value
    if isinstance(token, dict):
        token = token.get("content")
    if isinstance(token, str):
        found = inner.token_to_id(token)
        return None if found is None else int(found)
    return None


def _add_specials(inner: Any, tokens: Sequence[str], types: Sequence[int]) -> None:
    """Add the control and user-defined tokens to ``inner``, matched whole. As llama.cpp
    decodes them: control tokens are left out of decoded text, but for harmony's markup and
    Mistral's tool-call markup; user-defined ones (``<think>``, ``</think>`` in Qwen3's files)
    are text."""
    from tokenizers import AddedToken

    shown = (_HARMONY_MARKUP if _harmony(set(tokens)) else frozenset()) | _TOOL_MARKUP
    hidden, kept = [], []
    for t, ty in zip(tokens, types, strict=False):
        if ty == _CONTROL and t not in shown:
            hidden.append(AddedToken(t, special=True, normalized=False))
        elif ty in (_CONTROL, _USER_DEFINED):
            kept.append(AddedToken(t, special=False, normalized=False))
    # (add_special_tokens makes every token it adds special, so the kept ones go separately)
    inner.add_special_tokens(hidden)
    inner.add_tokens(kept)


def _pre_spec(named: Any, override: str | None, path: str | Path) -> PreTokenizerSpec:
    """The pre-tokenizer of a BPE GGUF: the override, the file's name, or llama.cpp's default."""
    from rlx_lm.pre_tokenizers import pre_tokenizer_spec

    if override is not None:
        return pre_tokenizer_spec(override, where=f"pre_tokenizer={override!r}")
    if named is None or named == "":
        warnings.warn(
            f"{path}: the GGUF names no pre-tokenizer (tokenizer.ggml.pre); using llama.cpp's "
            f"'default' split, which may tokenize differently from the model's own tokenizer",
            stacklevel=4,
        )
        named = "default"
    return pre_tokenizer_spec(str(named), where=str(path))


def _gpt2_tokenizer(
    tokens: Sequence[str],
    merges: Sequence[str],
    types: Sequence[int],
    spec: PreTokenizerSpec,
    path: str | Path,
) -> Any:
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, models, normalizers

    from rlx_lm.pre_tokenizers import pre_tokenizer_for

    vocab = {t: i for i, t in enumerate(tokens)}  # a repeated token keeps its last id (llama.cpp)
    pairs = []
    for m in merges:
        # llama.cpp splits at the first space after the first character.
        cut = m.find(" ", 1)
        if cut < 0:
            raise WeightFormatError(f"{path}: malformed merge {m!r} in tokenizer.ggml.merges")
        pairs.append((m[:cut], m[cut + 1 :]))
    try:
        inner = HfTokenizer(models.BPE(vocab, pairs, ignore_merges=spec.ignore_merges))
    except Exception as exc:  # the Rust builder refuses merges of unknown tokens
        raise WeightFormatError(f"{path}: inconsistent BPE vocabulary: {exc}") from None
    if spec.nfc:
        inner.normalizer = normalizers.NFC()
    inner.pre_tokenizer = pre_tokenizer_for(spec)
    inner.decoder = decoders.ByteLevel()
    _add_specials(inner, tokens, types)
    return inner


def _spm_tokenizer(
    tokens: Sequence[str], scores: Sequence[float], types: Sequence[int], *, space_prefix: bool
) -> Any:
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, models, normalizers

    vocab = {t: i for i, t in enumerate(tokens)}
    # Every split of a piece into two known pieces, ranked by the merged piece's score (Hugging
    # Face's converter), derived in the core (rust/spm_merges.rs: 6 s in Python for Gemma's
    # 256k pieces).
    mergeable = [ty in (_NORMAL, _USER_DEFINED) for ty in types[: len(scores)]]
    mergeable += [False] * (len(tokens) - len(mergeable))
    ranks = spm_merges(list(tokens), mergeable, [float(x) for x in scores])
    merges = [(tokens[left], tokens[right]) for left, right in ranks]
    unk = next((t for t, ty in zip(tokens, types, strict=False) if ty == _UNKNOWN), None)
    inner = HfTokenizer(
        models.BPE(
            vocab,
            merges,
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
    _add_specials(inner, tokens, types)
    return inner
