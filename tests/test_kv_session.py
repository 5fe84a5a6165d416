"""SessionSnapshot: immutability, fingerprint and geometry checks, pickle, save/load."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
from kv_toy_runner import ToyRunner
from safetensors.numpy import load_file

from rlx_lm import (
    KvCache,
    ModelFingerprint,
    SessionSnapshot,
    ShapeError,
    SnapshotMismatchError,
    WeightFormatError,
)

FP = ModelFingerprint("toy", (2, 2, 4), "abc")


def filled(n: int = 5, dtype: str = "float32", max_seq: int = 32) -> KvCache:
    c = KvCache(n_layers=2, n_kv_heads=2, head_dim=4, max_seq=max_seq, dtype=dtype)
    rng = np.random.default_rng(n)
    for layer in range(2):
        c.append(layer, *rng.standard_normal((2, 2, n, 4)).astype(np.float32))
    return c


def session(n: int = 5, dtype: str = "float32") -> SessionSnapshot:
    return SessionSnapshot(filled(n, dtype).snapshot(), range(100, 100 + n), FP)


def assert_same_rows(a: SessionSnapshot, b: SessionSnapshot) -> None:
    assert a.tokens == b.tokens
    assert a.fingerprint == b.fingerprint
    for layer in range(a.kv.n_layers):
        np.testing.assert_array_equal(a.kv.keys(layer), b.kv.keys(layer))
        np.testing.assert_array_equal(a.kv.values(layer), b.kv.values(layer))


def test_snapshot_is_immutable() -> None:
    s = session()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.tokens = (1,)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.kv = None  # type: ignore[misc]
    with pytest.raises(AttributeError):
        s.kv.len = 3  # the Rust snapshot is frozen too
    assert isinstance(s.tokens, tuple)
    assert not s.kv.keys(0).flags.writeable


def test_tokens_must_match_the_kv_length() -> None:
    with pytest.raises(ShapeError, match="5 tokens but 4"):
        SessionSnapshot(filled(5).snapshot(), range(4), FP)
    with pytest.raises(TypeError):
        SessionSnapshot(filled(1).snapshot(), [1], "not a fingerprint")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("other", "field"),
    [
        (ModelFingerprint("llama", (2, 2, 4), "abc"), "family"),
        (ModelFingerprint("toy", (2, 2, 8), "abc"), "geometry"),
        (ModelFingerprint("toy", (2, 2, 4), "xyz"), "model_id"),
    ],
)
def test_other_fingerprints_are_refused_by_name(other: ModelFingerprint, field: str) -> None:
    s = session()
    cache = filled(2)
    with pytest.raises(SnapshotMismatchError, match=field):
        s.restore_into(cache, other)
    assert cache.len() == 2  # untouched
    s.restore_into(cache, FP)
    assert cache.len() == 5


def test_missing_fingerprint_is_a_mismatch() -> None:
    s = SessionSnapshot(filled(2).snapshot(), [1, 2])
    with pytest.raises(SnapshotMismatchError, match="no fingerprint"):
        s.check(FP)


def test_geometry_mismatch_and_reuse_len_are_checked() -> None:
    s = session()
    for cache in [
        KvCache(n_layers=3, n_kv_heads=2, head_dim=4, max_seq=32),
        KvCache(n_layers=2, n_kv_heads=2, head_dim=4, max_seq=32, dtype="float16"),
        KvCache(n_layers=2, n_kv_heads=2, head_dim=4, max_seq=4),
    ]:
        with pytest.raises(SnapshotMismatchError):
            s.restore_into(cache, FP)
        assert cache.len() == 0
    cache = filled(1)
    with pytest.raises(SnapshotMismatchError, match="reuse_len"):
        s.restore_into(cache, FP, reuse_len=6)
    s.restore_into(cache, FP, reuse_len=3)
    np.testing.assert_array_equal(cache.keys(1), s.kv.keys(1)[:, :3])


def test_restoring_twice_gives_independent_sequences() -> None:
    runner = ToyRunner(seed=1)
    runner.prefill_logits([1, 2, 3, 4])
    snap = runner.export_session()
    outs = []
    for first in (5, 6):
        runner.restore_session(snap)
        outs.append([runner.decode_logits(first), runner.decode_logits(7)])
        fresh = ToyRunner(seed=1)
        np.testing.assert_allclose(
            outs[-1][1], fresh.reference_logits([1, 2, 3, 4, first, 7]), rtol=1e-5, atol=1e-5
        )
    assert not np.allclose(outs[0][1], outs[1][1])
    assert snap.tokens == (1, 2, 3, 4)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_pickle_round_trip(dtype: str) -> None:
    s = session(7, dtype)
    back = pickle.loads(pickle.dumps(s))
    assert isinstance(back, SessionSnapshot)
    assert_same_rows(s, back)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_save_load_round_trip_is_a_standard_safetensors_file(tmp_path: Path, dtype: str) -> None:
    s = session(9, dtype)
    path = tmp_path / "s.rlxkv"
    s.save(path)
    back = SessionSnapshot.load(path, fingerprint=FP)
    assert_same_rows(s, back)
    # Any safetensors reader sees the tensors; the metadata carries tokens and fingerprint.
    tensors = load_file(path)
    np.testing.assert_array_equal(tensors["layers.1.values"], s.kv.values(1))
    assert tensors["layers.0.keys"].dtype == np.dtype(dtype)
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    meta = json.loads(path.read_bytes()[8 : 8 + n])["__metadata__"]
    assert json.loads(meta["tokens"]) == list(s.tokens)
    assert ModelFingerprint.from_json(meta["fingerprint"]) == FP
    # A loaded snapshot restores and extends like any other.
    cache = KvCache(n_layers=2, n_kv_heads=2, head_dim=4, max_seq=32, dtype=dtype)
    back.restore_into(cache, FP)
    cache.append(0, np.ones((2, 1, 4), np.float32), np.ones((2, 1, 4), np.float32))
    assert cache.layer_len(0) == 10


def test_empty_snapshot_saves_and_loads(tmp_path: Path) -> None:
    c = KvCache(n_layers=2, n_kv_heads=2, head_dim=4, max_seq=8)
    s = SessionSnapshot(c.snapshot(), [], FP)
    s.save(tmp_path / "e.rlxkv")
    back = SessionSnapshot.load(tmp_path / "e.rlxkv")
    assert back.tokens == ()
    assert back.kv.len() == 0


def test_load_refuses_another_model(tmp_path: Path) -> None:
    session().save(tmp_path / "s.rlxkv")
    with pytest.raises(SnapshotMismatchError, match="model_id"):
        SessionSnapshot.load(tmp_path / "s.rlxkv", fingerprint=ModelFingerprint("toy", (2, 2, 4)))


def _corruptions(good: bytes) -> dict[str, bytes]:
    (n,) = struct.unpack("<Q", good[:8])
    header = json.loads(good[8 : 8 + n])

    def with_header(h: dict[str, object]) -> bytes:
        raw = json.dumps(h).encode()
        raw += b" " * (-len(raw) % 8)
        return struct.pack("<Q", len(raw)) + raw + good[8 + n :]

    def edit(fn: object) -> bytes:
        h = json.loads(json.dumps(header))
        fn(h)  # type: ignore[operator]
        return with_header(h)

    return {
        "truncated": good[:-3],
        "padded": good + b"\0" * 8,
        "empty": b"",
        "short header": good[:5],
        "huge header length": struct.pack("<Q", 1 << 40) + good[8:],
        "not json": struct.pack("<Q", 8) + b"{{{{{{{{" + good[16:],
        "foreign format": edit(lambda h: h["__metadata__"].update(format="other")),
        "no metadata": edit(lambda h: h.pop("__metadata__")),
        "version": edit(lambda h: h["__metadata__"].update(version="9")),
        "bad tokens": edit(lambda h: h["__metadata__"].update(tokens='["a"]')),
        "negative token": edit(lambda h: h["__metadata__"].update(tokens="[-1,2,3,4,5]")),
        "token count": edit(lambda h: h["__metadata__"].update(tokens="[1,2]")),
        "bad fingerprint": edit(lambda h: h["__metadata__"].update(fingerprint='{"a":1}')),
        "bad layers": edit(lambda h: h["__metadata__"].update(n_layers="3")),
        "zero heads": edit(lambda h: h["__metadata__"].update(n_kv_heads="0")),
        "huge max_seq": edit(lambda h: h["__metadata__"].update(max_seq=str(1 << 50))),
        "dtype": edit(lambda h: h["__metadata__"].update(dtype="int8")),
        "tensor shape": edit(lambda h: h["layers.0.keys"].update(shape=[2, 4, 5])),
        "tensor offsets": edit(lambda h: h["layers.1.values"].update(data_offsets=[0, 160])),
        "extra tensor": edit(lambda h: h.update(extra=h["layers.0.keys"])),
    }


def test_corrupt_files_are_refused_with_a_clear_error(tmp_path: Path) -> None:
    good_path = tmp_path / "good.rlxkv"
    session().save(good_path)
    bad = tmp_path / "bad.rlxkv"
    for case, content in _corruptions(good_path.read_bytes()).items():
        bad.write_bytes(content)
        with pytest.raises(WeightFormatError, match=r"bad\.rlxkv") as info:
            SessionSnapshot.load(bad)
        assert str(info.value), case
    assert SessionSnapshot.load(good_path).tokens == tuple(range(100, 105))


def test_corrupt_file_messages_say_what_is_wrong(tmp_path: Path) -> None:
    good_path = tmp_path / "good.rlxkv"
    session().save(good_path)
    bad = tmp_path / "bad.rlxkv"
    cases = _corruptions(good_path.read_bytes())
    for case, match in [
        ("truncated", "truncated"),
        ("foreign format", "foreign"),
        ("huge max_seq", "max_seq"),
        ("tensor shape", "layers.0.keys"),
    ]:
        bad.write_bytes(cases[case])
        with pytest.raises(WeightFormatError, match=match):
            SessionSnapshot.load(bad)


@pytest.mark.parametrize("fail_at", ["fsync", "replace"])
def test_failed_save_keeps_the_old_file_and_no_temporaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: str
) -> None:
    path = tmp_path / "s.rlxkv"
    session(3).save(path)
    before = path.read_bytes()

    def crash(*args: object) -> None:
        raise OSError(f"simulated crash in {fail_at}")

    monkeypatch.setattr(os, fail_at, crash)
    with pytest.raises(OSError, match="simulated"):
        session(6).save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.rlxkv"]
    assert SessionSnapshot.load(path).tokens == tuple(range(100, 103))


def test_save_replaces_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "s.rlxkv"
    session(3).save(path)
    session(6).save(path, durable=False)
    assert SessionSnapshot.load(path).tokens == tuple(range(100, 106))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.rlxkv"]
