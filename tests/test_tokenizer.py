"""Tokenizers from tokenizer.json and from GGUF headers, and the streaming detokenizer."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from model_factory import make_tiny, write_gguf, write_safetensors_dir
from tokenizer_factory import (
    BOS,
    EOS,
    bpe_gguf_fields,
    spm_gguf_fields,
    spm_reference_encode,
    spm_vocab,
    train_bpe,
)

from rlx_lm.errors import UnsupportedError, WeightFormatError
from rlx_lm.tokenizer import Tokenizer

TRAINED = train_bpe()
SPM_TOKENS, SPM_SCORES, _ = spm_vocab()

# Letters the vocabularies know, spaces/newlines, and characters of 2, 3 and 4 UTF-8 bytes.
TEXT = st.text(alphabet="the cat sat on mat hello world\n é日😀,!1", max_size=40)


@pytest.fixture(scope="module")
def bpe_gguf(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path = tmp_path_factory.mktemp("bpe") / "m.gguf"
    write_gguf(make_tiny(vocab=300), path, tokenizer=bpe_gguf_fields(TRAINED))
    return Tokenizer.load(path)


@pytest.fixture(scope="module")
def spm_gguf(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path = tmp_path_factory.mktemp("spm") / "m.gguf"
    write_gguf(make_tiny(vocab=len(SPM_TOKENS)), path, tokenizer=spm_gguf_fields())
    return Tokenizer.load(path)


@settings(max_examples=60)
@given(text=TEXT)
def test_gguf_bpe_encodes_like_the_tokenizer_it_was_written_from(
    bpe_gguf: Tokenizer, text: str
) -> None:
    bos = TRAINED.token_to_id(BOS)
    assert bpe_gguf.encode(text) == [bos, *TRAINED.encode(text).ids]
    assert bpe_gguf.decode(bpe_gguf.encode(text)) == text


@settings(max_examples=60)
@given(text=TEXT)
def test_gguf_sentencepiece_encodes_like_llama_cpp_spm(spm_gguf: Tokenizer, text: str) -> None:
    ids = spm_gguf.encode(text, add_special_tokens=False)
    assert ids == spm_reference_encode(text, SPM_TOKENS, SPM_SCORES)
    assert spm_gguf.decode(ids) == text
    assert spm_gguf.encode(text)[0] == 1, "add_bos_token puts <s> first"


def test_special_ids_come_from_the_gguf_header(bpe_gguf: Tokenizer, spm_gguf: Tokenizer) -> None:
    assert bpe_gguf.bos_id == TRAINED.token_to_id(BOS)
    assert bpe_gguf.eos_ids == {TRAINED.token_to_id(EOS)}
    assert (spm_gguf.bos_id, spm_gguf.eos_ids) == (1, {2})
    assert spm_gguf.is_eos(2)
    assert not spm_gguf.is_eos(1)


def test_directory_tokenizer_takes_eos_from_its_config_files(tmp_path: Path) -> None:
    m = make_tiny(vocab=300)
    m.tokenizer_json = TRAINED.to_str()
    d = write_safetensors_dir(m, tmp_path / "m")
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": BOS, "eos_token": EOS}))
    tok = Tokenizer.load(d)
    assert tok.bos_id == TRAINED.token_to_id(BOS)
    assert tok.eos_ids == {TRAINED.token_to_id(EOS)}
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 7]}))
    assert Tokenizer.load(d / "model.safetensors").eos_ids == {5, 7}
    assert tok.encode("hello world") == TRAINED.encode("hello world").ids


@settings(max_examples=60)
@given(text=TEXT)
def test_streaming_never_emits_a_broken_character_and_adds_up(
    bpe_gguf: Tokenizer, spm_gguf: Tokenizer, text: str
) -> None:
    for tok in (bpe_gguf, spm_gguf):
        ids = tok.encode(text, add_special_tokens=False)
        det = tok.detokenizer()
        pieces = [det.push(t) for t in ids]
        pieces.append(det.flush())
        assert "".join(pieces) == tok.decode(ids)
        assert all("\ufffd" not in p for p in pieces)


def test_a_four_byte_character_is_held_back_until_complete(spm_gguf: Tokenizer) -> None:
    ids = spm_gguf.encode("😀", add_special_tokens=False)[-4:]  # four <0xNN> byte tokens
    det = spm_gguf.detokenizer()
    assert [det.push(t) for t in ids] == ["", "", "", "😀"]


def test_prompt_context_keeps_the_space_before_the_first_generated_word(
    spm_gguf: Tokenizer,
) -> None:
    prompt = spm_gguf.encode("hello")
    full = spm_gguf.encode("hello world", add_special_tokens=False)
    generated = full[len(prompt) - 1 :]
    det = spm_gguf.detokenizer(prompt)
    assert "".join(det.push(t) for t in generated) + det.flush() == " world"


def test_unknown_tokenizer_model_and_missing_tokenizer_are_refused(tmp_path: Path) -> None:
    fields = spm_gguf_fields() | {"tokenizer.ggml.model": "rwkv"}
    bad = write_gguf(make_tiny(vocab=len(SPM_TOKENS)), tmp_path / "a.gguf", tokenizer=fields)
    with pytest.raises(UnsupportedError, match="rwkv"):
        Tokenizer.load(bad)
    bare = write_gguf(make_tiny(), tmp_path / "b.gguf")
    with pytest.raises(WeightFormatError, match="no tokenizer"):
        Tokenizer.load(bare)
    with pytest.raises(WeightFormatError, match=r"no tokenizer\.json"):
        Tokenizer.load(tmp_path)


@pytest.mark.parametrize(
    ("pre", "digits"),
    [("llama-bpe", ["123", "45"]), ("qwen2", ["1", "2", "3", "4", "5"]), ("gpt-2", ["12345"])],
)
def test_gguf_pre_tokenizer_name_picks_the_split_rules(
    tmp_path: Path, pre: str, digits: list[str]
) -> None:
    # llama3 groups digits by three, qwen2 splits every digit, GPT-2 keeps the run whole.
    fields = bpe_gguf_fields(TRAINED) | {"tokenizer.ggml.pre": pre}
    tok = Tokenizer.load(write_gguf(make_tiny(vocab=300), tmp_path / "m.gguf", tokenizer=fields))
    pieces = [p for p, _ in tok.inner.pre_tokenizer.pre_tokenize_str("I'm 12345")]
    assert pieces[:2] == ["I", "'m"]
    assert [p.lstrip("Ġ") for p in pieces[2:] if p.lstrip("Ġ")] == digits
    assert tok.decode(tok.encode("I'm 12345 ok", add_special_tokens=False)) == "I'm 12345 ok"


def test_sentencepiece_without_space_prefix(tmp_path: Path) -> None:
    fields = spm_gguf_fields() | {"tokenizer.ggml.add_space_prefix": False}
    tok = Tokenizer.load(
        write_gguf(make_tiny(vocab=len(SPM_TOKENS)), tmp_path / "m.gguf", tokenizer=fields)
    )
    ids = tok.encode("the cat", add_special_tokens=False)
    # "the" without the leading ▁ cannot use the "▁the" piece
    assert ids[0] != SPM_TOKENS.index("▁the")
    assert ids == spm_reference_encode("the cat", SPM_TOKENS, SPM_SCORES, space_prefix=False)
    assert tok.decode(ids) == "the cat"


def _huge_array_gguf(tmp_path: Path) -> Path:
    """97 bytes declaring a 2^40-item string array (issue 16)."""
    import struct

    key = b"tokenizer.ggml.tokens"
    raw = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
    raw += struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 8, 1 << 40)
    raw += b"\0" * (97 - len(raw))
    assert len(raw) == 97
    bad = tmp_path / "huge.gguf"
    bad.write_bytes(raw)
    return bad


@pytest.mark.parametrize("loader", ["Tokenizer.load", "load_llama", "load_model"])
def test_a_gguf_claiming_a_huge_metadata_array_is_refused_at_once(
    tmp_path: Path, loader: str
) -> None:
    # Issue 16: 97 bytes declaring a 2^40-item string array hung Tokenizer.load and
    # load_llama (through gguf.GGUFReader) with memory growing; the bounds-checked
    # walker refuses it up front, on every path that opens a model.
    from rlx_lm import load_model
    from rlx_lm.runners.llama import load_llama

    bad = _huge_array_gguf(tmp_path)
    load = {"Tokenizer.load": Tokenizer.load, "load_llama": load_llama, "load_model": load_model}
    t0 = time.monotonic()
    with pytest.raises(WeightFormatError, match="claims 1099511627776 items"):
        load[loader](bad)
    assert time.monotonic() - t0 < 10


def test_the_cli_refuses_a_gguf_claiming_a_huge_metadata_array_in_one_line(
    tmp_path: Path,
) -> None:
    # The CLI built the tokenizer before validating anything, and hung there.
    import subprocess
    import sys

    bad = _huge_array_gguf(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "rlx_lm.cli", "generate", str(bad), "-p", "hi", "-n", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("rlx-lm: error:")
    assert "claims 1099511627776 items" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("tokenizer.ggml.token_type", ["x", "y"], "int32|integer array"),
        ("tokenizer.ggml.merges", ["nospace"], "malformed merge"),
        ("tokenizer.ggml.scores", [0.5], "fewer items|1 items for"),
    ],
)
def test_malformed_tokenizer_fields_are_typed_errors(
    tmp_path: Path, field: str, value: list[Any], match: str
) -> None:
    base = spm_gguf_fields() if field == "tokenizer.ggml.scores" else bpe_gguf_fields(TRAINED)
    path = write_gguf(make_tiny(vocab=300), tmp_path / "m.gguf", tokenizer=base | {field: value})
    with pytest.raises(WeightFormatError, match=match):
        Tokenizer.load(path)


def test_building_sentencepiece_is_not_quadratic_in_token_length(tmp_path: Path) -> None:
    # Issue 16: every cut of every piece was looked up, O(len^2) per piece; a 600 000
    # character token took minutes. Cuts are now tried only at lengths tokens have.
    fields = spm_gguf_fields()
    long_piece = "\u2581" + "a" * 600_000
    fields["tokenizer.ggml.tokens"] = [*fields["tokenizer.ggml.tokens"], long_piece]
    fields["tokenizer.ggml.scores"] = [*fields["tokenizer.ggml.scores"], -1.0]
    fields["tokenizer.ggml.token_type"] = [*fields["tokenizer.ggml.token_type"], 1]
    n = len(fields["tokenizer.ggml.tokens"])
    path = write_gguf(make_tiny(vocab=n), tmp_path / "m.gguf", tokenizer=fields)
    t0 = time.monotonic()
    tok = Tokenizer.load(path)
    assert time.monotonic() - t0 < 20
    # The short vocabulary still tokenizes as llama.cpp's SPM does.
    text = "the cat sat on the mat"
    assert tok.encode(text, add_special_tokens=False) == spm_reference_encode(
        text, SPM_TOKENS, SPM_SCORES
    )


@settings(max_examples=40, deadline=None)
@given(texts=st.lists(st.text(alphabet="the cat\n,!é", min_size=0, max_size=3), max_size=3))
def test_ids_containing_is_every_token_whose_text_holds_a_string(
    bpe_gguf: Tokenizer, spm_gguf: Tokenizer, texts: list[str]
) -> None:
    # The reference: decode each id alone and look.
    for tok in (bpe_gguf, spm_gguf):
        got = tok.ids_containing(texts)
        wanted = [t for t in texts if t]
        want = {
            i
            for i in range(tok.vocab_size)
            if any(t in tok.decode([i], skip_special_tokens=False) for t in wanted)
        }
        for t in wanted:
            want.update(tok.encode(t, add_special_tokens=False))
        assert got == tuple(sorted(want))
        assert tok.ids_containing(texts) is got or not wanted  # cached per set of strings


def test_ids_containing_finds_the_tokens_around_a_string(bpe_gguf: Tokenizer) -> None:
    alone = set(bpe_gguf.encode("at", add_special_tokens=False))
    got = set(bpe_gguf.ids_containing(["at"]))
    assert alone < got  # "hat" breaks too, as llama.cpp reads a breaker string
    assert all("at" in bpe_gguf.decode([i]) for i in got - alone)
    assert bpe_gguf.ids_containing([]) == ()
    assert bpe_gguf.ids_containing([""]) == ()


def _plain_spm_merges(
    tokens: list[str], mergeable: list[bool], scores: list[float]
) -> list[tuple[int, int]]:
    """Every cut of every mergeable piece into two pieces of the vocabulary, best score
    first, then by ids (a piece listed twice counts once, as its last listing)."""
    last = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for piece, i in last.items():
        if not mergeable[i] or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in last and right in last:
                ranked.append((-scores[i], last[left], last[right]))
    return [(left, right) for _, left, right in sorted(ranked)]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.text(alphabet="ab\u2581é😀", min_size=1, max_size=5), min_size=1, max_size=40),
    st.data(),
)
def test_spm_merges_from_the_core_equal_every_split_ranked_by_score(
    tokens: list[str], data: st.DataObject
) -> None:
    from rlx_lm._core import spm_merges

    n = len(tokens)
    mergeable = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    scores = data.draw(st.lists(st.sampled_from([-3.0, -1.5, 0.0, 2.0]), min_size=n, max_size=n))
    # A piece listed twice keeps its last listing's flag and score, as the vocabulary does.
    for i, t in enumerate(tokens):
        j = max(k for k, u in enumerate(tokens) if u == t)
        mergeable[i], scores[i] = mergeable[j], scores[j]
    assert spm_merges(tokens, mergeable, scores) == _plain_spm_merges(tokens, mergeable, scores)
