"""rlx_lm.KvCache: views, layer-by-layer appends, snapshots, typed errors."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rlx_lm
from rlx_lm import (
    CapacityError,
    DtypeError,
    InvalidOptionError,
    KvCache,
    KvSnapshot,
    ShapeError,
    SnapshotMismatchError,
)

H, D = 2, 4


def cache(n_layers: int = 2, max_seq: int = 16, dtype: str = "float32") -> KvCache:
    return KvCache(n_layers=n_layers, n_kv_heads=H, head_dim=D, max_seq=max_seq, dtype=dtype)


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((H, n, D)).astype(np.float32)


def fill(c: KvCache, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    k, v = rows(n, seed), rows(n, seed + 1)
    for layer in range(c.n_layers):
        c.append(layer, k, v)
    return k, v


def test_names_are_exported() -> None:
    assert rlx_lm.KvCache is KvCache
    assert rlx_lm.KvSnapshot is KvSnapshot


def test_views_show_exactly_the_rows_appended() -> None:
    c = cache()
    k1, v1 = fill(c, 3)
    k2, v2 = fill(c, 2, seed=10)
    np.testing.assert_array_equal(c.keys(1), np.concatenate([k1, k2], axis=1))
    np.testing.assert_array_equal(c.values(0), np.concatenate([v1, v2], axis=1))
    assert c.keys(0).shape == (H, 5, D)
    assert c.keys(0).dtype == np.float32
    assert c.len() == 5
    assert c.nbytes == 2 * 2 * H * 5 * D * 4


def test_views_are_read_only_zero_copy_windows() -> None:
    c = cache()
    fill(c, 3)
    view = c.keys(0)
    assert not view.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        view[0, 0, 0] = 1.0
    # Two views of the same layer are the same memory (no copy on either call).
    assert np.shares_memory(view, c.keys(0))
    assert view.base is not None


def test_layer_by_layer_append_mid_forward_pass() -> None:
    c = cache(n_layers=3)
    fill(c, 4)
    k, v = rows(1, 7), rows(1, 8)
    c.append(0, k, v)
    # Causal attention over the new token needs it in layer 0 already.
    assert c.keys(0).shape[1] == 5
    np.testing.assert_array_equal(c.keys(0)[:, 4:], k)
    assert c.keys(1).shape[1] == 4
    assert c.len() == 4
    assert [c.layer_len(i) for i in range(3)] == [5, 4, 4]
    with pytest.raises(ShapeError, match="mid forward pass"):
        c.snapshot()
    # Rolling back an aborted step: truncate to len().
    c.truncate(c.len())
    assert [c.layer_len(i) for i in range(3)] == [4, 4, 4]
    c.snapshot()


def test_old_views_never_change() -> None:
    c = cache()
    k, _ = fill(c, 3)
    view = c.keys(0)
    fill(c, 2, seed=5)
    np.testing.assert_array_equal(view, k)  # still the three rows it showed
    c.truncate(1)
    k_new, _ = fill(c, 4, seed=9)
    np.testing.assert_array_equal(view, k)  # the cache moved instead of overwriting
    np.testing.assert_array_equal(c.keys(0), np.concatenate([k[:, :1], k_new], axis=1))
    c.clear()
    np.testing.assert_array_equal(view, k)
    assert c.keys(0).shape == (H, 0, D)
    assert c.len() == 0
    assert c.nbytes == 0


def test_strided_inputs_are_accepted() -> None:
    c = cache(n_layers=1)
    tnd = np.random.default_rng(3).standard_normal((5, H, D)).astype(np.float32)
    k = tnd.transpose(1, 0, 2)  # the usual [tokens, heads, dim] -> [heads, tokens, dim]
    v = np.ascontiguousarray(k[:, ::-1, :])[:, :, :]
    wide = np.repeat(k, 2, axis=2)[:, :, ::2]
    c.append(0, k, v)
    c.append(0, wide, k[:, ::-1])
    np.testing.assert_array_equal(c.keys(0), np.concatenate([k, wide], axis=1))
    np.testing.assert_array_equal(c.values(0), np.concatenate([v, k[:, ::-1]], axis=1))


def _bad_calls() -> list[tuple[str, Callable[[KvCache], object], type[Exception], str]]:
    good = rows(1)
    return [
        ("float64", lambda c: c.append(0, good.astype(np.float64), good), DtypeError, "float32"),
        ("list", lambda c: c.append(0, good.tolist(), good), DtypeError, "np.asarray"),
        ("2-D", lambda c: c.append(0, good[0], good), ShapeError, "3-D"),
        ("heads", lambda c: c.append(0, rows(1)[:1], rows(1)[:1]), ShapeError, "n_kv_heads"),
        ("n_new", lambda c: c.append(0, rows(1), rows(2)), ShapeError, "same n_new"),
        ("layer", lambda c: c.append(2, good, good), InvalidOptionError, "layer"),
        ("negative", lambda c: c.append(-1, good, good), InvalidOptionError, "layer"),
        ("capacity", lambda c: c.append(0, rows(14), rows(14)), CapacityError, "capacity"),
        ("truncate", lambda c: c.truncate(4), InvalidOptionError, "holds 3"),
        ("keys", lambda c: c.keys(5), InvalidOptionError, "out of range"),
        ("restore", lambda c: c.restore("x"), TypeError, "KvSnapshot"),  # type: ignore[arg-type]
    ]


@pytest.mark.parametrize(("name", "call", "error", "match"), _bad_calls())
def test_bad_calls_raise_typed_errors_and_change_nothing(
    name: str, call: Callable[[KvCache], object], error: type[Exception], match: str
) -> None:
    c = cache(max_seq=16)
    k, v = fill(c, 3)
    with pytest.raises(error, match=match):
        call(c)
    assert c.len() == 3
    for layer in range(2):
        np.testing.assert_array_equal(c.keys(layer), k)
        np.testing.assert_array_equal(c.values(layer), v)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_layers": 0}, "n_layers"),
        ({"n_kv_heads": -1}, "n_kv_heads"),
        ({"head_dim": 0}, "head_dim"),
        ({"max_seq": 0}, "max_seq"),
        ({"max_seq": 2**62}, "max_seq"),
        ({"n_layers": 2**40}, "n_layers"),
        ({"head_dim": 2**62}, "head_dim"),
        ({"dtype": "int8"}, "dtype"),
    ],
)
def test_constructor_validates(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"n_layers": 1, "n_kv_heads": 1, "head_dim": 1, "max_seq": 1}
    args.update(kwargs)
    with pytest.raises(InvalidOptionError, match=match):
        KvCache(**args)  # type: ignore[arg-type]


def test_constructor_is_keyword_only_and_accepts_numpy_dtypes() -> None:
    with pytest.raises(TypeError):
        KvCache(1, 1, 1, 1)  # type: ignore[misc]
    assert KvCache(n_layers=1, n_kv_heads=1, head_dim=1, max_seq=1, dtype=np.float16).dtype == (
        "float16"
    )


def test_snapshot_shares_memory_and_restore_reuses_it() -> None:
    c = cache()
    k, v = fill(c, 5)
    snap = c.snapshot()
    assert snap.len() == 5
    assert snap.nbytes == c.nbytes
    assert np.shares_memory(snap.keys(0), c.keys(0))
    other = cache(max_seq=32)
    other.restore(snap)
    assert np.shares_memory(other.values(1), snap.values(1))
    np.testing.assert_array_equal(other.values(1), v)
    np.testing.assert_array_equal(other.keys(0), k)
    assert [u[0] for u in snap.storage()] == [u[0] for u in c.snapshot().storage()]


def test_two_restores_of_one_snapshot_diverge_independently() -> None:
    base = cache()
    k, v = fill(base, 4)
    snap = base.snapshot()
    a, b = cache(), cache()
    a.restore(snap)
    b.restore(snap)
    ka, va = fill(a, 2, seed=20)
    kb, vb = fill(b, 3, seed=30)
    kc, vc = fill(base, 1, seed=40)
    for layer in range(2):
        for c, kx, vx in [(a, ka, va), (b, kb, vb), (base, kc, vc)]:
            np.testing.assert_array_equal(c.keys(layer), np.concatenate([k, kx], axis=1))
            np.testing.assert_array_equal(c.values(layer), np.concatenate([v, vx], axis=1))
        np.testing.assert_array_equal(snap.keys(layer), k)
        np.testing.assert_array_equal(snap.values(layer), v)


def test_restore_refuses_other_geometry() -> None:
    c = cache()
    fill(c, 5)
    snap = c.snapshot()
    for other in [
        cache(n_layers=3),
        cache(dtype="float16"),
        cache(max_seq=4),
        KvCache(n_layers=2, n_kv_heads=H, head_dim=D + 1, max_seq=16),
    ]:
        if other.head_dim == D:
            fill(other, 1)
        before = other.len()
        with pytest.raises(SnapshotMismatchError):
            other.restore(snap)
        assert other.len() == before


def test_snapshot_pickles() -> None:
    for dtype in ["float32", "float16"]:
        c = cache(dtype=dtype)
        fill(c, 6)
        snap = c.snapshot()
        back = pickle.loads(pickle.dumps(snap))
        assert isinstance(back, KvSnapshot)
        assert back.len() == 6
        assert back.dtype == dtype
        assert not np.shares_memory(back.keys(0), snap.keys(0))
        for layer in range(2):
            np.testing.assert_array_equal(back.keys(layer), snap.keys(layer))
            np.testing.assert_array_equal(back.values(layer), snap.values(layer))
        fresh = cache(dtype=dtype)
        fresh.restore(back)
        fill(fresh, 2)
        assert fresh.len() == 8
    empty = pickle.loads(pickle.dumps(cache().snapshot()))
    assert empty.len() == 0


def test_copies_of_an_immutable_snapshot_are_the_snapshot() -> None:
    c = cache()
    fill(c, 2)
    snap = c.snapshot()
    assert copy.copy(snap) is snap
    assert copy.deepcopy(snap) is snap


def test_corrupt_pickle_state_is_refused() -> None:
    c = cache()
    fill(c, 2)
    func, (state,) = c.snapshot().__reduce__()
    with pytest.raises(rlx_lm.WeightFormatError):
        func(state[:-1])
    with pytest.raises(rlx_lm.WeightFormatError):
        func(b"nonsense" + state[8:])


@given(
    hnp.arrays(
        np.float32,
        st.tuples(st.just(H), st.integers(1, 6), st.just(D)),
        elements=st.floats(width=32, allow_nan=False)
        | st.sampled_from([np.float32(65520.0), np.float32(2.0**-25), np.float32(6e-8)]),
    )
)
def test_float16_storage_rounds_like_numpy(k: np.ndarray) -> None:
    c = cache(n_layers=1, dtype="float16")
    c.append(0, k, -k)
    assert c.keys(0).dtype == np.float16
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(c.keys(0), k.astype(np.float16))
        np.testing.assert_array_equal(c.values(0), (-k).astype(np.float16))
    assert c.nbytes == 2 * H * k.shape[1] * D * 2


def test_views_outlive_the_cache() -> None:
    c = cache()
    k, _ = fill(c, 3)
    view = c.keys(1)
    snap = c.snapshot()
    del c, snap
    np.testing.assert_array_equal(view, k)
