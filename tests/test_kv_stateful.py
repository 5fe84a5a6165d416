"""Stateful test: KvCache against a plain-Python model of per-layer row lists.

Arbitrary interleavings of append / snapshot / restore / truncate / clear over
two caches never change what an earlier snapshot or view shows, and views
always show exactly the rows appended.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rlx_lm import (
    CapacityError,
    InvalidOptionError,
    KvCache,
    KvSnapshot,
    ShapeError,
    SnapshotMismatchError,
)

N_LAYERS = 3
MAX_SEQ = (10, 14)  # two caches of different capacity


@dataclass
class Model:
    """What a cache or snapshot should hold: per layer, lists of [heads, dim] rows."""

    h: int
    d: int
    keys: list[list[np.ndarray]] = field(default_factory=lambda: [[] for _ in range(N_LAYERS)])
    values: list[list[np.ndarray]] = field(default_factory=lambda: [[] for _ in range(N_LAYERS)])

    def copy(self) -> Model:
        return Model(self.h, self.d, [list(k) for k in self.keys], [list(v) for v in self.values])

    def len(self) -> int:
        return min(len(k) for k in self.keys)

    def stacked(self, layer: int, half: str) -> np.ndarray:
        rows = (self.keys if half == "keys" else self.values)[layer]
        if not rows:
            return np.zeros((self.h, 0, self.d), np.float32)
        return np.stack(rows, axis=1)


class KvCacheMachine(RuleBasedStateMachine):
    dtype = "float32"
    h, d = 2, 2

    def __init__(self) -> None:
        super().__init__()
        self.caches = [
            KvCache(
                n_layers=N_LAYERS, n_kv_heads=self.h, head_dim=self.d, max_seq=m, dtype=self.dtype
            )
            for m in MAX_SEQ
        ]
        self.models = [Model(self.h, self.d), Model(self.h, self.d)]
        self.snapshots: list[tuple[KvSnapshot, Model]] = []
        self.views: list[tuple[np.ndarray, np.ndarray]] = []
        self.counter = 0

    def expect(self, a: np.ndarray) -> np.ndarray:
        return a.astype(self.dtype)

    def fresh_rows(self, n: int) -> np.ndarray:
        size = self.h * n * self.d
        base = np.arange(self.counter, self.counter + size, dtype=np.float32)
        self.counter += size
        return (base / 8).reshape(self.h, n, self.d)

    def do_append(self, c: int, layer: int, n: int) -> None:
        cache, model = self.caches[c], self.models[c]
        k, v = self.fresh_rows(n), self.fresh_rows(n)
        if len(model.keys[layer]) + n > MAX_SEQ[c]:
            with pytest.raises(CapacityError):
                cache.append(layer, k, v)
            return
        cache.append(layer, k, v)
        model.keys[layer].extend(k[:, t] for t in range(n))
        model.values[layer].extend(v[:, t] for t in range(n))

    @rule(c=st.integers(0, 1), layer=st.integers(0, N_LAYERS - 1), n=st.integers(0, 3))
    def append_one_layer(self, c: int, layer: int, n: int) -> None:
        self.do_append(c, layer, n)

    @rule(c=st.integers(0, 1), n=st.integers(1, 4))
    def append_every_layer(self, c: int, n: int) -> None:
        for layer in range(N_LAYERS):
            self.do_append(c, layer, n)

    @rule(c=st.integers(0, 1))
    def snapshot(self, c: int) -> None:
        model = self.models[c]
        if any(len(k) != model.len() for k in model.keys):
            with pytest.raises(ShapeError):
                self.caches[c].snapshot()
            return
        self.snapshots.append((self.caches[c].snapshot(), model.copy()))

    @precondition(lambda self: self.snapshots)
    @rule(c=st.integers(0, 1), data=st.data())
    def restore(self, c: int, data: st.DataObject) -> None:
        snap, model = data.draw(st.sampled_from(self.snapshots))
        if model.len() > MAX_SEQ[c]:
            with pytest.raises(SnapshotMismatchError):
                self.caches[c].restore(snap)
            return
        self.caches[c].restore(snap)
        self.models[c] = model.copy()

    @rule(c=st.integers(0, 1), data=st.data())
    def truncate(self, c: int, data: st.DataObject) -> None:
        model = self.models[c]
        n = data.draw(st.integers(0, model.len() + 1))
        if n > model.len():
            with pytest.raises(InvalidOptionError):
                self.caches[c].truncate(n)
            return
        self.caches[c].truncate(n)
        for rows in [*model.keys, *model.values]:
            del rows[n:]

    @rule(c=st.integers(0, 1))
    def clear(self, c: int) -> None:
        self.caches[c].clear()
        self.models[c] = Model(self.h, self.d)

    @rule(c=st.integers(0, 1), layer=st.integers(0, N_LAYERS - 1), half=st.sampled_from(["k", "v"]))
    def hold_view(self, c: int, layer: int, half: str) -> None:
        cache, model = self.caches[c], self.models[c]
        if half == "k":
            self.views.append((cache.keys(layer), model.stacked(layer, "keys")))
        else:
            self.views.append((cache.values(layer), model.stacked(layer, "values")))

    @precondition(lambda self: self.views)
    @rule(data=st.data())
    def drop_view(self, data: st.DataObject) -> None:
        self.views.pop(data.draw(st.integers(0, len(self.views) - 1)))

    @precondition(lambda self: self.snapshots)
    @rule(data=st.data())
    def drop_snapshot(self, data: st.DataObject) -> None:
        self.snapshots.pop(data.draw(st.integers(0, len(self.snapshots) - 1)))

    @invariant()
    def caches_match_their_models(self) -> None:
        for cache, model in zip(self.caches, self.models, strict=True):
            assert cache.len() == model.len()
            for layer in range(N_LAYERS):
                assert cache.layer_len(layer) == len(model.keys[layer])
                expected_k = self.expect(model.stacked(layer, "keys"))
                np.testing.assert_array_equal(cache.keys(layer), expected_k)
                np.testing.assert_array_equal(
                    cache.values(layer), self.expect(model.stacked(layer, "values"))
                )

    @invariant()
    def snapshots_never_change(self) -> None:
        for snap, model in self.snapshots:
            assert snap.len() == model.len()
            for layer in range(N_LAYERS):
                np.testing.assert_array_equal(
                    snap.keys(layer), self.expect(model.stacked(layer, "keys"))
                )
                np.testing.assert_array_equal(
                    snap.values(layer), self.expect(model.stacked(layer, "values"))
                )

    @invariant()
    def held_views_never_change(self) -> None:
        for view, expected in self.views:
            np.testing.assert_array_equal(view, self.expect(expected))


class Float16Machine(KvCacheMachine):
    dtype = "float16"


class PageRowsMachine(KvCacheMachine):
    """One 4 KiB page per row: released memory (rows past every claim) is real pages."""

    h, d = 1, 1024


TestKvCacheStateful = KvCacheMachine.TestCase
TestKvCacheStateful.settings = settings(stateful_step_count=40)
TestKvCacheFloat16Stateful = Float16Machine.TestCase
TestKvCacheFloat16Stateful.settings = settings(stateful_step_count=25, max_examples=50)
TestKvCachePageRowsStateful = PageRowsMachine.TestCase
TestKvCachePageRowsStateful.settings = settings(stateful_step_count=30, max_examples=60)
