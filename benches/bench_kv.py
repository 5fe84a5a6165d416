"""KvCache and SessionSnapshot against numpy doing the same job, in the same run.

The issue's four ratios, on a Llama-3-8B-shaped cache (32 layers, 8 KV heads,
head_dim 128, float32) holding 4096 tokens, which is exactly 1 GiB of rows:

- snapshot: `cache.snapshot()` vs copying every layer's keys and values with numpy;
- restore: `cache.restore(snap)` vs copying those tensors back into preallocated arrays;
- append one token to every layer vs writing the same rows into preallocated numpy arrays;
- save/load of the 1 GiB snapshot vs `np.save`/`np.load` of one array of the same bytes.

``make bench`` times them (release build); ``make check`` runs each once on a
tiny cache as a smoke test.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlx_lm import KvCache, ModelFingerprint, SessionSnapshot

N_KV_HEADS, HEAD_DIM = 8, 128


@dataclass
class Setup:
    n_layers: int
    tokens: int
    cache: KvCache
    snap: SessionSnapshot


@pytest.fixture(scope="module")
def setup(request: pytest.FixtureRequest) -> Setup:
    smoke = bool(request.config.getoption("benchmark_disable", False))
    n_layers, tokens = (4, 64) if smoke else (32, 4096)
    cache = KvCache(
        n_layers=n_layers, n_kv_heads=N_KV_HEADS, head_dim=HEAD_DIM, max_seq=tokens + 64
    )
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((N_KV_HEADS, tokens, HEAD_DIM), dtype=np.float32)
    for layer in range(n_layers):
        cache.append(layer, rows, rows)
    fp = ModelFingerprint("bench", (n_layers, N_KV_HEADS, HEAD_DIM))
    snap = SessionSnapshot(cache.snapshot(), range(tokens), fp)
    return Setup(n_layers, tokens, cache, snap)


def _group(setup: Setup, what: str) -> str:
    return f"kv {what} {setup.tokens} tok x {setup.n_layers} layers"


# ------------------------------------------------------------------ snapshot


def test_snapshot_numpy_copy(benchmark: Any, setup: Setup) -> None:
    benchmark.group = _group(setup, "snapshot")
    benchmark.extra_info["baseline"] = True
    c = setup.cache

    def copy_all() -> list[np.ndarray]:
        return [a.copy() for i in range(setup.n_layers) for a in (c.keys(i), c.values(i))]

    assert len(benchmark(copy_all)) == 2 * setup.n_layers


def test_snapshot_kvcache(benchmark: Any, setup: Setup) -> None:
    benchmark.group = _group(setup, "snapshot")
    assert benchmark(setup.cache.snapshot).len() == setup.tokens


# ------------------------------------------------------------------- restore


def test_restore_numpy_copy(benchmark: Any, setup: Setup) -> None:
    benchmark.group = _group(setup, "restore")
    benchmark.extra_info["baseline"] = True
    kv = setup.snap.kv
    src = [a for i in range(setup.n_layers) for a in (kv.keys(i), kv.values(i))]
    dst = [np.empty_like(a) for a in src]

    def copy_back() -> None:
        for d, s in zip(dst, src, strict=True):
            np.copyto(d, s)

    benchmark(copy_back)
    np.testing.assert_array_equal(dst[-1], src[-1])


def test_restore_kvcache(benchmark: Any, setup: Setup) -> None:
    benchmark.group = _group(setup, "restore")
    target = KvCache(
        n_layers=setup.n_layers, n_kv_heads=N_KV_HEADS, head_dim=HEAD_DIM, max_seq=setup.tokens
    )
    benchmark(target.restore, setup.snap.kv)
    assert target.len() == setup.tokens


# ------------------------------------------------------------ append a token


def _one_token() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    k = rng.standard_normal((N_KV_HEADS, 1, HEAD_DIM)).astype(np.float32)
    return k, -k


def test_append_numpy_preallocated(benchmark: Any, setup: Setup) -> None:
    benchmark.group = _group(setup, "append 1 token to every layer of")
    benchmark.extra_info["baseline"] = True
    n_layers, cap = setup.n_layers, setup.tokens
    keys = [np.empty((N_KV_HEADS, cap, HEAD_DIM), np.float32) for _ in range(n_layers)]
    values = [np.empty((N_KV_HEADS, cap, HEAD_DIM), np.float32) for _ in range(n_layers)]
    k, v = _one_token()
    pos = [0]

    def step() -> None:
        t = pos[0]
        for layer in range(n_layers):
            keys[layer][:, t : t + 1] = k
            values[layer][:, t : t + 1] = v
        pos[0] = t + 1 if t + 1 < cap else 0

    benchmark(step)


def test_append_kvcache(benchmark: Any, setup: Setup) -> None:
    benchmark.group = _group(setup, "append 1 token to every layer of")
    n_layers, cap = setup.n_layers, setup.tokens
    cache = KvCache(n_layers=n_layers, n_kv_heads=N_KV_HEADS, head_dim=HEAD_DIM, max_seq=cap)
    k, v = _one_token()

    def step() -> None:
        if cache.len() == cap:
            cache.clear()
        for layer in range(n_layers):
            cache.append(layer, k, v)

    benchmark(step)
    np.testing.assert_array_equal(cache.values(0)[:, -1:], v)


# ----------------------------------------------------------------- save/load


@pytest.fixture(scope="module")
def as_one_array(setup: Setup) -> np.ndarray:
    kv = setup.snap.kv
    return np.stack([a for i in range(setup.n_layers) for a in (kv.keys(i), kv.values(i))])


def _fresh(path: Path) -> None:
    """Before each timed save (not timed): remove the target, so both sides measure the
    write and not ext4's flush-on-rename-over-an-existing-file (docs/kv_cache.md), and
    flush dirty pages, so a save is not throttled by the writeback of earlier rounds."""
    path.unlink(missing_ok=True)
    os.sync()


def _rounds(setup: Setup) -> int:
    return 7 if setup.tokens > 1000 else 1


def test_save_numpy(benchmark: Any, setup: Setup, as_one_array: np.ndarray, tmp_path: Path) -> None:
    benchmark.group = _group(setup, "save")
    benchmark.extra_info["baseline"] = True
    assert as_one_array.nbytes == setup.snap.nbytes
    path = tmp_path / "a.npy"
    benchmark.pedantic(
        np.save, (path, as_one_array), setup=lambda: _fresh(path), rounds=_rounds(setup)
    )


def test_save_snapshot(benchmark: Any, setup: Setup, tmp_path: Path) -> None:
    benchmark.group = _group(setup, "save")
    path = tmp_path / "s.rlxkv"
    benchmark.pedantic(
        setup.snap.save,
        (path,),
        {"durable": False},
        setup=lambda: _fresh(path),
        rounds=_rounds(setup),
    )


def test_save_numpy_fsync(
    benchmark: Any, setup: Setup, as_one_array: np.ndarray, tmp_path: Path
) -> None:
    benchmark.group = _group(setup, "durable save")
    benchmark.extra_info["baseline"] = True
    path = tmp_path / "a.npy"

    def save_and_sync() -> None:
        with open(path, "wb") as f:
            np.save(f, as_one_array)
            f.flush()
            os.fsync(f.fileno())

    benchmark.pedantic(save_and_sync, setup=lambda: _fresh(path), rounds=_rounds(setup))


def test_save_snapshot_durable(benchmark: Any, setup: Setup, tmp_path: Path) -> None:
    benchmark.group = _group(setup, "durable save")
    path = tmp_path / "s.rlxkv"
    benchmark.pedantic(setup.snap.save, (path,), setup=lambda: _fresh(path), rounds=_rounds(setup))


def test_load_numpy(benchmark: Any, setup: Setup, as_one_array: np.ndarray, tmp_path: Path) -> None:
    benchmark.group = _group(setup, "load")
    benchmark.extra_info["baseline"] = True
    np.save(tmp_path / "a.npy", as_one_array)
    assert benchmark(np.load, tmp_path / "a.npy").nbytes == setup.snap.nbytes


def test_load_snapshot(benchmark: Any, setup: Setup, tmp_path: Path) -> None:
    benchmark.group = _group(setup, "load")
    setup.snap.save(tmp_path / "s.rlxkv", durable=False)
    loaded = benchmark(SessionSnapshot.load, tmp_path / "s.rlxkv")
    assert loaded.tokens == setup.snap.tokens
    np.testing.assert_array_equal(loaded.kv.values(setup.n_layers - 1), setup.snap.kv.values(0))
