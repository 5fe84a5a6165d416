"""GGUF pre-tokenizers by ``tokenizer.ggml.pre`` name, on strings where their splits differ.

The expected pieces are worked out by hand from llama.cpp's regex lists (each regex splits
every piece further; matched and unmatched spans alike become pieces) or from the model's
own tokenizer.json regex where llama.cpp notes it as the original.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from model_factory import make_tiny, write_gguf
from tokenizer_factory import BOS, bpe_gguf_fields, train_bpe

from rlx_lm.errors import UnsupportedError
from rlx_lm.pre_tokenizers import PRE_TOKENIZERS, pre_tokenizer_for, pre_tokenizer_spec
from rlx_lm.tokenizer import Tokenizer

TRAINED = train_bpe()


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte <-> printable character table, inverted (written out for the test)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


BYTES = _byte_decoder()


def pieces(name: str, text: str) -> list[str]:
    pre = pre_tokenizer_for(pre_tokenizer_spec(name))
    return [bytes(BYTES[c] for c in p).decode() for p, _ in pre.pre_tokenize_str(text)]


CASES: list[tuple[str, str, list[str]]] = [
    # GPT-2: digits stay one run, each newline its own piece.
    ("gpt-2", "I'm 12345 ok!!", ["I", "'m", " 12345", " ok", "!!"]),
    ("gpt-2", "Hello WORLD\n\nfoo", ["Hello", " WORLD", "\n", "\n", "foo"]),
    # llama3: digits by three, the space before them alone, newlines together.
    ("llama-bpe", "I'm 12345 ok!!", ["I", "'m", " ", "123", "45", " ok", "!!"]),
    ("llama-bpe", "Hello WORLD\n\nfoo", ["Hello", " WORLD", "\n\n", "foo"]),
    ("llama-bpe", "x\U0001f600y", ["x", "\U0001f600y"]),
    # qwen2: every digit alone.
    ("qwen2", "I'm 12345 ok!!", ["I", "'m", " ", "1", "2", "3", "4", "5", " ok", "!!"]),
    ("qwen2", "!!\n", ["!!\n"]),
    ("qwen2", "e\u0301x", ["e", "\u0301x"]),
    # qwen35: combining marks belong to the word.
    ("qwen35", "e\u0301x", ["e\u0301x"]),
    # starcoder / smollm: digits alone first, then GPT-2's split.
    ("smollm", "I'm 12345 ok!!", ["I", "'m", " ", "1", "2", "3", "4", "5", " ok", "!!"]),
    ("smollm", "Hello WORLD\n\nfoo", ["Hello", " WORLD", "\n", "\n", "foo"]),
    # falcon: punctuation runs (backtick included) first, then GPT-2, then digit triples.
    ("falcon", "I'm 12345 ok!!", ["I", "'", "m", " ", "123", "45", " ok", "!!"]),
    ("falcon", "a`+b", ["a", "`+", "b"]),
    # llama.cpp's default: like falcon without the backtick in the first class.
    ("default", "I'm 12345 ok!!", ["I", "'", "m", " ", "123", "45", " ok", "!!"]),
    ("default", "a`+b", ["a", "`", "+", "b"]),
    # deepseek-coder: letters, punctuation, then single digits.
    (
        "deepseek-coder",
        "I'm 12345 ok!!",
        ["I", "'", "m", " ", "1", "2", "3", "4", "5", " ok", "!!"],
    ),
    # deepseek-v3: a punctuation mark starts an ASCII word; symbols never join letters.
    ("deepseek-v3", "I'm 12345 ok!!", ["I", "'m", " ", "123", "45", " ok", "!!"]),
    ("deepseek-v3", "x\U0001f600y", ["x", "\U0001f600", "y"]),
    # bloom / poro: anything but spaces and sentence punctuation, one optional space first.
    ("bloom", "I'm 12345 ok!!", ["I'm", " 12345", " ok", "!!"]),
    ("viking", "I'm 12345 ok!!", ["I'm", " ", "1", "2", "3", "4", "5", " ok", "!!"]),
    # tekken: words split at case changes, digits alone.
    ("tekken", "HelloWorld 12", ["Hello", "World", " ", "1", "2"]),
    ("llama-bpe", "HelloWorld 12", ["HelloWorld", " ", "12"]),
    # gpt-4o / llama4: case changes split, contractions stay on the word.
    ("gpt-4o", "I'm HelloWorld 12345", ["I'm", " Hello", "World", " ", "123", "45"]),
    # seed-coder: punctuation never takes the newline after it.
    ("seed-coder", "!!\n", ["!!", "\n"]),
    # jais-2: runs of spaces in powers of two.
    ("jais-2", "a" + " " * 7 + "b", ["a", "    ", "  ", " b"]),
    ("llama-bpe", "a" + " " * 7 + "b", ["a", "      ", " b"]),
]


@pytest.mark.parametrize(("name", "text", "want"), CASES)
def test_each_pre_tokenizer_splits_as_its_regexes_say(
    name: str, text: str, want: list[str]
) -> None:
    assert pieces(name, text) == want


@pytest.mark.parametrize("name", sorted(PRE_TOKENIZERS))
def test_every_known_name_builds_a_tokenizer_that_round_trips(tmp_path: Path, name: str) -> None:
    fields = bpe_gguf_fields(TRAINED) | {"tokenizer.ggml.pre": name}
    tok = Tokenizer.load(write_gguf(make_tiny(vocab=300), tmp_path / "m.gguf", tokenizer=fields))
    text = "Hello, world! 12345 café\n\n  naïve 日本語 😀"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text


def test_an_unknown_pre_tokenizer_is_refused_and_can_be_overridden(tmp_path: Path) -> None:
    fields = bpe_gguf_fields(TRAINED) | {"tokenizer.ggml.pre": "mystery-bpe"}
    path = write_gguf(make_tiny(vocab=300), tmp_path / "m.gguf", tokenizer=fields)
    with pytest.raises(UnsupportedError, match=r"'mystery-bpe'.*pre_tokenizer=") as info:
        Tokenizer.load(path)
    assert "gpt-2" in str(info.value), "the message lists the known names"
    tok = Tokenizer.load(path, pre_tokenizer="gpt-2")
    assert tok.encode("hello world 123") == [
        TRAINED.token_to_id(BOS),
        *TRAINED.encode("hello world 123").ids,
    ]
    with pytest.raises(UnsupportedError, match="nonsense"):
        Tokenizer.load(path, pre_tokenizer="nonsense")


def test_a_missing_name_uses_llama_cpps_default_and_says_so(tmp_path: Path) -> None:
    fields: dict[str, Any] = bpe_gguf_fields(TRAINED)
    del fields["tokenizer.ggml.pre"]
    path = write_gguf(make_tiny(vocab=300), tmp_path / "m.gguf", tokenizer=fields)
    with pytest.warns(UserWarning, match="names no pre-tokenizer"):
        tok = Tokenizer.load(path)
    split = [p for p, _ in tok.inner.pre_tokenizer.pre_tokenize_str("a`+b")]
    assert split == ["a", "`", "+", "b"]


def test_name_flags_bos_and_ignore_merges(tmp_path: Path) -> None:
    bos = TRAINED.token_to_id(BOS)

    def load(**fields: Any) -> Tokenizer:
        f = bpe_gguf_fields(TRAINED) | fields
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return Tokenizer.load(
                write_gguf(make_tiny(vocab=300), tmp_path / "m.gguf", tokenizer=f)
            )

    # llama3 adds BOS unless the file says otherwise; chatglm has none at all.
    f = bpe_gguf_fields(TRAINED) | {"tokenizer.ggml.pre": "llama-bpe"}
    del f["tokenizer.ggml.add_bos_token"]
    path = write_gguf(make_tiny(vocab=300), tmp_path / "l3.gguf", tokenizer=f)
    assert Tokenizer.load(path).encode("hi")[0] == bos
    assert load(**{"tokenizer.ggml.pre": "llama-bpe"}).encode("hi")[0] == bos
    glm = load(**{"tokenizer.ggml.pre": "chatglm-bpe"})
    assert glm.bos_id is None
    assert bos not in glm.encode("hi")
    assert PRE_TOKENIZERS["llama-bpe"].ignore_merges
    assert PRE_TOKENIZERS["tekken"].ignore_merges
    assert not PRE_TOKENIZERS["gpt-2"].ignore_merges


def test_aliases_share_their_familys_rules() -> None:
    for alias, family in [
        ("llama3", "llama-bpe"),
        ("falcon3", "llama-bpe"),
        ("starcoder", "smollm"),
        ("command-r", "smollm"),
        ("mpt", "gpt-2"),
        ("olmo", "gpt-2"),
        ("deepseek-r1-qwen", "qwen2"),
        ("poro-chat", "bloom"),
        ("llama4", "gpt-4o"),
        ("glm4", "chatglm-bpe"),
    ]:
        assert PRE_TOKENIZERS[alias] == PRE_TOKENIZERS[family], alias
