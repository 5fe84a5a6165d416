"""Hostile models and misuse on the engine path (issue 16): malformed, truncated and lying
GGUF files, bad token ids, sessions of another runner, wrong arrays at the Rust engine.

Each case gets a typed `rlx_lm.RlxError` (or the builtin ``TypeError`` for an object of the
wrong kind) whose message names the problem; nothing panics, aborts or hangs; the user's
file is left byte for byte as it was, and a refused call leaves the session as it was.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf_edit import set_f32, set_tensor, set_u32, tensor_fields
from model_factory import make_tiny, write_gguf
from tokenizer_factory import spm_gguf_fields, spm_vocab

import rlx_lm
from rlx_lm import (
    KvCache,
    LmRunnerBuilder,
    ShapeError,
    SnapshotMismatchError,
    TokenOutOfRangeError,
    UnsupportedError,
    WeightFormatError,
)
from rlx_lm._core import KV_MAX_SEQ
from rlx_lm.errors import CapacityError, DtypeError, InvalidOptionError, RlxError
from rlx_lm.runners.llama import LlamaRunner, load_llama

TOKENS, _, _ = spm_vocab()
ARCH = "llama"
Q4_0 = 2


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid tiny llama GGUF with a tokenizer (the CLI needs one)."""
    path = tmp_path_factory.mktemp("hostile") / "base.gguf"
    model = make_tiny(ARCH, seed=5, vocab=len(TOKENS))
    return write_gguf(model, path, tokenizer=spm_gguf_fields())


def _size(p: Path) -> int:
    return p.stat().st_size


def _ffn_down_offset_plus(n: int) -> Callable[[Path], None]:
    def edit(p: Path) -> None:
        _, _, offset = tensor_fields(p, "blk.1.ffn_down.weight")
        set_tensor(p, "blk.1.ffn_down.weight", offset=offset + n)

    return edit


# (id, edit, exception class, a regex the message must match)
HOSTILE: list[tuple[str, Callable[[Path], None], type[Exception], str]] = [
    ("truncated_tail", lambda p: os.truncate(p, _size(p) - 100), WeightFormatError, "truncated"),
    ("truncated_half", lambda p: os.truncate(p, _size(p) // 2), WeightFormatError, "truncated"),
    (
        "offset_past_end",
        lambda p: set_tensor(p, "blk.1.ffn_down.weight", offset=_size(p) * 4),
        WeightFormatError,
        r"truncated: tensor 'blk\.1\.ffn_down\.weight'",
    ),
    (
        "offset_near_2_64",
        lambda p: set_tensor(p, "blk.1.ffn_down.weight", offset=2**64 - 32),
        WeightFormatError,
        r"blk\.1\.ffn_down\.weight",
    ),
    ("offset_misaligned", _ffn_down_offset_plus(1), WeightFormatError, "not aligned"),
    ("offset_into_next", _ffn_down_offset_plus(-32), WeightFormatError, "overlaps"),
    (
        "shape_overflows_u64",
        lambda p: set_tensor(p, "token_embd.weight", dims=[2**62, 2**62]),
        WeightFormatError,
        r"token_embd\.weight.*claims shape",
    ),
    (
        "shape_too_small",
        lambda p: set_tensor(p, "token_embd.weight", dims=[32, 8]),
        WeightFormatError,
        "belong to no tensor",
    ),
    (
        "type_lies",  # F32 data declared Q4_0: smaller, so it would be read as other numbers
        lambda p: set_tensor(p, "blk.0.attn_q.weight", ggml_type=Q4_0),
        WeightFormatError,
        "type or shape does not match its data",
    ),
    (
        "type_unknown",
        lambda p: set_tensor(p, "blk.0.attn_q.weight", ggml_type=99),
        WeightFormatError,
        "unknown GGML type 99",
    ),
    (
        "vocab_larger_than_embedding",
        lambda p: set_u32(p, f"{ARCH}.vocab_size", len(TOKENS) + 100),
        WeightFormatError,
        r"token_embd\.weight has shape",
    ),
    (
        "vocab_smaller_than_embedding",
        lambda p: set_u32(p, f"{ARCH}.vocab_size", 5),
        WeightFormatError,
        r"token_embd\.weight has shape",
    ),
    (
        "zero_heads",
        lambda p: set_u32(p, f"{ARCH}.attention.head_count", 0),
        WeightFormatError,
        "n_heads must be positive",
    ),
    (
        "zero_kv_heads",
        lambda p: set_u32(p, f"{ARCH}.attention.head_count_kv", 0),
        WeightFormatError,
        "n_kv_heads=0",
    ),
    (
        "kv_heads_not_dividing",
        lambda p: set_u32(p, f"{ARCH}.attention.head_count_kv", 3),
        WeightFormatError,
        "not a multiple of n_kv_heads=3",
    ),
    (
        "head_dim_odd",
        lambda p: (
            set_u32(p, f"{ARCH}.attention.key_length", 7),
            set_u32(p, f"{ARCH}.attention.value_length", 7),
        ),
        WeightFormatError,
        "head_dim must be a positive even number, got 7",
    ),
    (
        "head_dim_huge",  # fuzz finding: 3.25 GiB of RoPE tables before any tensor check
        lambda p: (
            set_u32(p, f"{ARCH}.attention.key_length", 872415364),
            set_u32(p, f"{ARCH}.attention.value_length", 872415364),
        ),
        WeightFormatError,
        "head_dim 872415364 is over the supported 65536",
    ),
    (
        "head_dim_not_the_weights",
        lambda p: (
            set_u32(p, f"{ARCH}.attention.key_length", 16),
            set_u32(p, f"{ARCH}.attention.value_length", 16),
        ),
        WeightFormatError,
        r"attn_q\.weight has shape",
    ),
    (
        "value_length_differs",
        lambda p: set_u32(p, f"{ARCH}.attention.value_length", 16),
        UnsupportedError,
        "value_length=16 differs from the key length",
    ),
    (
        "more_blocks_than_tensors",
        lambda p: set_u32(p, f"{ARCH}.block_count", 3),
        WeightFormatError,
        r"missing tensor blk\.2\.",
    ),
    (
        "fewer_blocks_than_tensors",  # silently ran a model one block short before
        lambda p: set_u32(p, f"{ARCH}.block_count", 1),
        WeightFormatError,
        "has 1 blocks but the file has tensors of more",
    ),
    (
        "block_count_2_32",
        lambda p: set_u32(p, f"{ARCH}.block_count", 2**32 - 1),
        WeightFormatError,
        "n_layers: must be between 1 and 2",
    ),
    (
        "hidden_2_32",
        lambda p: set_u32(p, f"{ARCH}.embedding_length", 2**32 - 1),
        WeightFormatError,
        "hidden_size: must be between 1 and 2",
    ),
    (  # found by the gguf_engine fuzz target: int(nan) raised a bare ValueError
        "hidden_is_a_float_nan",
        lambda p: set_f32(p, f"{ARCH}.embedding_length", float("nan")),
        WeightFormatError,
        rf"GGUF field {ARCH}\.embedding_length must be an integer, got float nan",
    ),
    (
        "heads_is_a_float",
        lambda p: set_f32(p, f"{ARCH}.attention.head_count", 2.0),
        WeightFormatError,
        rf"GGUF field {ARCH}\.attention\.head_count must be an integer",
    ),
    (
        "rope_theta_nan",
        lambda p: set_f32(p, f"{ARCH}.rope.freq_base", float("nan")),
        WeightFormatError,
        rf"GGUF field {ARCH}\.rope\.freq_base must be finite",
    ),
    (  # 1 / theta ** x divided by zero before
        "rope_theta_zero",
        lambda p: set_f32(p, f"{ARCH}.rope.freq_base", 0.0),
        WeightFormatError,
        "rope_theta must be positive and finite, got 0.0",
    ),
    (
        "rope_theta_negative",
        lambda p: set_f32(p, f"{ARCH}.rope.freq_base", -1.0),
        WeightFormatError,
        "rope_theta must be positive",
    ),
    (
        "heads_2_31",
        lambda p: set_u32(p, f"{ARCH}.attention.head_count", 2**31),
        WeightFormatError,
        "n_heads",
    ),
]


def _hostile_copy(base: Path, tmp_path: Path, edit: Callable[[Path], None]) -> tuple[Path, str]:
    path = tmp_path / "model.gguf"
    shutil.copy(base, path)
    edit(path)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("edit", "error", "match"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE]
)
@pytest.mark.parametrize("entry", ["build", "load_llama", "load_model"])
def test_a_malformed_gguf_is_refused_with_a_typed_error_naming_the_problem(
    base: Path,
    tmp_path: Path,
    edit: Callable[[Path], None],
    error: type[Exception],
    match: str,
    entry: str,
) -> None:
    path, digest = _hostile_copy(base, tmp_path, edit)
    load: dict[str, Callable[[], object]] = {
        "build": lambda: LmRunnerBuilder().weights(path).build(),
        "load_llama": lambda: load_llama(path),
        "load_model": lambda: rlx_lm.load_model(path),
    }
    with pytest.raises(error, match=match) as info:
        load[entry]()
    assert isinstance(info.value, RlxError)
    assert str(path) in str(info.value) or entry == "load_model", "the message names the file"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, "the file was changed"


@pytest.mark.parametrize("case", ["truncated_half", "type_lies", "block_count_2_32"])
def test_the_cli_reports_a_malformed_gguf_in_one_line(
    base: Path, tmp_path: Path, case: str
) -> None:
    edit = next(h[1] for h in HOSTILE if h[0] == case)
    path, digest = _hostile_copy(base, tmp_path, edit)
    done = subprocess.run(
        [sys.executable, "-m", "rlx_lm.cli", "generate", str(path), "-p", "hi", "-n", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "panicked" not in done.stderr
    assert done.stderr.startswith("rlx-lm: error:")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_a_huge_declared_context_is_capped_at_what_the_cache_can_hold(
    base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2^32 - 1 trained positions on a machine with memory for all of them: the default
    context was the header's claim, which the KV cache then refused as a max_seq."""
    import rlx_lm.context as context

    path, _ = _hostile_copy(
        base, tmp_path, lambda p: set_u32(p, f"{ARCH}.context_length", 2**32 - 1)
    )
    assert context.default_context(path, budget_bytes=2**50) == KV_MAX_SEQ
    monkeypatch.setattr(context, "_available_memory", lambda: 2**50)
    runner, tokenizer = rlx_lm.load_model(path)
    assert runner.max_seq == KV_MAX_SEQ
    assert len(rlx_lm.generate(runner, tokenizer, "hi", max_tokens=2).tokens) == 2


# -- a loaded runner, misused ------------------------------------------------------


@pytest.fixture(scope="module")
def runner(base: Path) -> LlamaRunner:
    r = load_llama(base, max_seq=32)
    assert isinstance(r, LlamaRunner)
    return r


@pytest.fixture(scope="module")
def other(base: Path, tmp_path_factory: pytest.TempPathFactory) -> LlamaRunner:
    """A runner of another model with the same geometry (other weights)."""
    path = tmp_path_factory.mktemp("other") / "other.gguf"
    r = load_llama(write_gguf(make_tiny(ARCH, seed=6, vocab=len(TOKENS)), path), max_seq=32)
    assert isinstance(r, LlamaRunner)
    return r


def _session_state(r: LlamaRunner) -> tuple[tuple[int, ...], int]:
    return r.tokens, r._cache.len()


BAD_IDS = [-1, 10**6, 2**63 + 1]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_bad_token_ids_are_refused_and_the_session_is_kept(runner: LlamaRunner, bad: int) -> None:
    vocab = runner.vocab_size
    first = runner.prefill_logits([1, 2, 3])
    before = _session_state(runner)
    with pytest.raises(TokenOutOfRangeError, match=str(bad)):
        runner.decode_logits(bad)
    with pytest.raises((TokenOutOfRangeError, InvalidOptionError)):
        runner.prefill_logits([1, bad] if bad < 2**63 else np.array([1, bad], np.uint64))
    with pytest.raises(TokenOutOfRangeError):
        runner.prefill_logits([vocab])
    assert _session_state(runner) == before  # a refused prefill keeps the session it replaced
    snap = runner.export_session()
    with pytest.raises(TokenOutOfRangeError):
        runner.decode_batch([snap, snap], [1, bad])
    assert _session_state(runner) == before
    np.testing.assert_array_equal(runner.decode_logits(4), runner.predict_logits([1, 2, 3, 4]))
    assert first.shape == (vocab,)


@pytest.mark.parametrize("token", [1.0, True, None, "1", np.float32(1)])
def test_non_integer_tokens_are_refused(runner: LlamaRunner, token: object) -> None:
    runner.prefill_logits([1, 2])
    with pytest.raises((InvalidOptionError, TypeError)):
        runner.decode_logits(token)  # type: ignore[arg-type]
    assert runner.tokens == (1, 2)


def test_sessions_of_another_runner_are_refused_and_nothing_changes(
    runner: LlamaRunner, other: LlamaRunner
) -> None:
    other.prefill_logits([5, 6, 7])
    foreign = other.export_session()
    runner.prefill_logits([1, 2])
    before = _session_state(runner)
    with pytest.raises(SnapshotMismatchError, match="model_id"):
        runner.restore_session(foreign)
    with pytest.raises(SnapshotMismatchError, match="model_id"):
        runner.decode_batch([runner.export_session(), foreign], [1, 1])
    with pytest.raises(SnapshotMismatchError, match="model_id"):
        runner.prefill_logits_reusing([5, 6, 7, 8], foreign, 3)
    assert _session_state(runner) == before or runner.tokens == ()
    assert other.tokens == (5, 6, 7)


def test_a_session_longer_than_the_cache_is_refused(runner: LlamaRunner, base: Path) -> None:
    long = load_llama(base, max_seq=64)
    long.prefill_logits(list(range(1, 41)))
    snap = long.export_session()
    with pytest.raises(SnapshotMismatchError, match="max_seq=32"):
        runner.restore_session(snap)
    with pytest.raises(CapacityError, match="40 tokens"):
        runner.decode_batch([snap], [1])


# -- the Rust engine called directly --------------------------------------------------


def _cache(r: LlamaRunner, max_seq: int = 8, n_layers: int | None = None) -> KvCache:
    c = r.cfg
    return KvCache(
        n_layers=n_layers or c.n_layers,
        n_kv_heads=c.n_kv_heads,
        head_dim=c.head_dim,
        max_seq=max_seq,
    )


def test_the_engine_refuses_wrong_arrays_with_typed_errors(runner: LlamaRunner) -> None:
    engine, cache = runner.engine, _cache(runner)
    engine.forward(cache, np.array([1], np.int64))
    refused: list[tuple[Callable[[], object], type[Exception], str]] = [
        (lambda: engine.forward(cache, np.array([1.0])), DtypeError, "int64, got float64"),
        (lambda: engine.forward(cache, np.array([1], np.int32)), DtypeError, "int64, got int32"),
        (lambda: engine.forward(cache, [1, 2]), DtypeError, "numpy int64 array, got list"),
        (lambda: engine.forward(cache, np.arange(8)[::2]), DtypeError, "C-contiguous"),
        (lambda: engine.forward(cache, np.zeros((1, 2), np.int64)), ShapeError, "1-D"),
        (lambda: engine.forward(cache, np.zeros(0, np.int64)), InvalidOptionError, "no tokens"),
        (lambda: engine.forward(cache, np.array([10**6])), TokenOutOfRangeError, "1000000"),
        (lambda: engine.forward(object(), np.array([1])), TypeError, "must be a rlx_lm.KvCache"),
        (
            lambda: engine.forward(_cache(runner, n_layers=3), np.array([1])),
            SnapshotMismatchError,
            r"\(3, ",
        ),
        (lambda: engine.forward(cache, np.arange(1, 9)), CapacityError, "capacity"),
        (lambda: engine.decode(cache, 2**70), InvalidOptionError, "64 bits"),
        (lambda: engine.decode(cache, -3), TokenOutOfRangeError, "-3"),
        (lambda: engine.decode(cache, 1.0), TypeError, "integer token id, got float"),
        (lambda: engine.decode(cache, True), TypeError, "integer token id, got bool"),
        (lambda: engine.decode_batch([cache, cache], [1, 2]), InvalidOptionError, "twice"),
        (lambda: engine.decode_batch([cache], [1, 2]), ShapeError, "one token per cache"),
        (lambda: engine.embed(np.array([-1])), TokenOutOfRangeError, "-1"),
        (lambda: engine.embed(np.array([1], np.float32)), DtypeError, "float32"),
    ]
    for call, error, match in refused:
        with pytest.raises(error, match=match):
            call()
        assert cache.len() == 1, match  # no refused call changed the cache
    np.testing.assert_array_equal(engine.decode(cache, np.int64(2)), runner.predict_logits([1, 2]))


def test_a_refused_batch_changes_no_cache(runner: LlamaRunner) -> None:
    engine = runner.engine
    caches = [_cache(runner) for _ in range(3)]
    for c in caches:
        engine.forward(c, np.array([1, 2], np.int64))
    with pytest.raises(TokenOutOfRangeError):
        engine.decode_batch(caches, [3, 4, runner.vocab_size])
    assert [c.len() for c in caches] == [2, 2, 2]
