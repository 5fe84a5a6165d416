"""The pre-tokenizers of byte-level BPE vocabularies, by GGUF ``tokenizer.ggml.pre`` name.

A ``gpt2``-model GGUF names its pre-tokenizer (the regexes that cut text into words before
BPE merges) in ``tokenizer.ggml.pre``. llama.cpp knows each name by its regex list
(``src/llama-vocab.cpp``): every regex in turn splits each piece further, matched and
unmatched spans alike becoming pieces, and the pieces are then byte-encoded as GPT-2 does.
`pre_tokenizer_for` rebuilds that as a `tokenizers` pre-tokenizer (one ``Split`` per regex,
``isolated``, then ``ByteLevel``). Where llama.cpp adapted a regex to its own engine (case-
insensitive groups spelled out, ``\\p{Lu}``-style classes approximated) and notes the
original from the model's ``tokenizer.json``, the original is used: Oniguruma, the regex
engine of `tokenizers`, runs it as the model's own tokenizer does.

A name not listed is refused with `UnsupportedError` (llama.cpp refuses it too); the caller
can name a known pre-tokenizer instead (``Tokenizer.load(path, pre_tokenizer="gpt-2")``,
``rlx-lm --pre-tokenizer``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlx_lm.errors import UnsupportedError

__all__ = ["PRE_TOKENIZERS", "PreTokenizerSpec", "pre_tokenizer_for", "pre_tokenizer_spec"]

_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
JAIS2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|"
    r"\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"
)
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
DEEPSEEK_CODER = ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")
DEEPSEEK3 = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|"
    r" ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
FALCON = (r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]")
DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]")
STARCODER = (r"\p{N}", GPT2)
BLOOM = (" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+",)
VIKING = (BLOOM[0], r"\p{N}")
TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SEED_CODER = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
BAILINGMOE = (
    r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"
)
MINICPM5 = (
    r"\p{N}{1,3}",
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+",
)
UFAKZEKA = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LAGUNA = (r"[^\n]+|[\n]+", QWEN2)


@dataclass(frozen=True)
class PreTokenizerSpec:
    """One llama.cpp pre-tokenizer: its regexes, and the vocabulary flags the name sets."""

    regexes: tuple[str, ...]
    ignore_merges: bool = False
    """A word that is itself a token is that token, whatever the merges say."""
    add_bos: bool | None = None
    """llama.cpp's BOS default for the name (the GGUF's add_bos_token overrides it)."""
    no_bos: bool = False
    """The name clears the BOS token (chatglm)."""
    nfc: bool = False
    """Normalise to NFC first, as Qwen 2's tokenizer.json does (llama.cpp does not)."""


def _spec(*regexes: str, **kw: Any) -> PreTokenizerSpec:
    return PreTokenizerSpec(tuple(regexes), **kw)


_LLAMA3_SPEC = _spec(LLAMA3, ignore_merges=True, add_bos=True)
_GPT2_SPEC = _spec(GPT2)
_STARCODER_SPEC = _spec(*STARCODER)
_BLOOM_SPEC = _spec(*BLOOM)
_GPT4O_SPEC = _spec(GPT4O)

#: ``tokenizer.ggml.pre`` name -> spec, for every name whose regexes are reproduced exactly.
PRE_TOKENIZERS: dict[str, PreTokenizerSpec] = {
    "default": _spec(*DEFAULT),
    **dict.fromkeys(
        (
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ),
        _LLAMA3_SPEC,
    ),
    "dbrx": _spec(LLAMA3),
    "smaug-bpe": _spec(LLAMA3, ignore_merges=True),
    "jais-2": _spec(JAIS2),
    "deepseek-coder": _spec(*DEEPSEEK_CODER),
    "deepseek-v3": _spec(*DEEPSEEK3),
    "hunyuan-dense": _spec(*DEEPSEEK3),
    "joyai-llm": _spec(*DEEPSEEK3),
    "hy_v4": _spec(*DEEPSEEK3),
    "falcon": _spec(*FALCON),
    **dict.fromkeys(
        (
            "starcoder",
            "refact",
            "command-r",
            "smollm",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ),
        _STARCODER_SPEC,
    ),
    **dict.fromkeys(
        (
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
            "exaone4",
        ),
        _GPT2_SPEC,
    ),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), _spec(QWEN2, nfc=True)),
    **dict.fromkeys(
        ("kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open", "grok-2"),
        _spec(QWEN2),
    ),
    "qwen35": _spec(QWEN35),
    **dict.fromkeys(("poro-chat", "bloom", "gpt3-finnish"), _BLOOM_SPEC),
    **dict.fromkeys(("chatglm-bpe", "glm4"), _spec(LLAMA3, no_bos=True)),
    "viking": _spec(*VIKING),
    "tekken": _spec(TEKKEN, ignore_merges=True, add_bos=True),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O_SPEC),
    "seed-coder": _spec(SEED_CODER),
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"), _spec(BAILINGMOE)),
    "minicpm5": _spec(*MINICPM5, ignore_merges=True),
    "ufakzeka": _spec(UFAKZEKA),
    "laguna": _spec(*LAGUNA),
}


def pre_tokenizer_spec(name: str, *, where: str = "") -> PreTokenizerSpec:
    """The spec of ``name``; `UnsupportedError` naming the way out when it is unknown."""
    spec = PRE_TOKENIZERS.get(name)
    if spec is None:
        prefix = f"{where}: " if where else ""
        shown = repr(name) if name else "(none)"
        raise UnsupportedError(
            f"{prefix}the GGUF's pre-tokenizer tokenizer.ggml.pre = {shown} is not one this "
            f"library knows, and another split would tokenize text wrongly. If you know which "
            f"one the model uses, name it: Tokenizer.load(path, pre_tokenizer=NAME) or "
            f"rlx-lm --pre-tokenizer NAME (known: {', '.join(sorted(PRE_TOKENIZERS))})"
        )
    return spec


def pre_tokenizer_for(spec: PreTokenizerSpec) -> Any:
    """The `tokenizers` pre-tokenizer for ``spec``: one isolated Split per regex, ByteLevel."""
    from tokenizers import Regex, pre_tokenizers

    steps: list[Any] = [
        pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in spec.regexes
    ]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)
