"""Stateful test: KvCache against a plain-Python model of per-layer row lists.

Arbitrary interleavings of append / snapshot / restore / truncate / clear over
two caches never change what an earlier snapshot or view shows, and views
always show exactly the rows appended.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

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
    ModelFingerprint,
    PromptCache,
    SessionSnapshot,
    ShapeError,
    SnapshotMismatchError,
)

N_LAYERS = 3
MAX_SEQ = (10, 14)  # two caches of different capacity


def same(got: np.ndarray, want: np.ndarray) -> None:
    """``np.testing.assert_array_equal``'s verdict at a tenth of its cost (it was 70% of a
    step of the campaign, ``tests/stateful_campaign.py``); its message when they differ."""
    if not np.array_equal(got, want):
        np.testing.assert_array_equal(got, want)


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
                same(cache.keys(layer), expected_k)
                same(cache.values(layer), self.expect(model.stacked(layer, "values")))

    @invariant()
    def snapshots_never_change(self) -> None:
        for snap, model in self.snapshots:
            assert snap.len() == model.len()
            for layer in range(N_LAYERS):
                same(snap.keys(layer), self.expect(model.stacked(layer, "keys")))
                same(snap.values(layer), self.expect(model.stacked(layer, "values")))

    @invariant()
    def held_views_never_change(self) -> None:
        for view, expected in self.views:
            same(view, self.expect(expected))


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


# -- the prompt cache over KV sessions, persisted, reopened and damaged ------------------

PC_FP = ModelFingerprint("stateful", (1, 1, 2), "m")
PC_BLOCK_BYTES = 16 * 2 * 1 * 2 * 4


class PromptCacheMachine(RuleBasedStateMachine):
    """A persistent PromptCache fed by a session that grows, backtracks and diverges.

    Rows encode their token, so every snapshot the cache hands back proves it is
    the right one; reopening with the same budget loses no entry; damaged files
    are refused (never raised) and nothing else is lost with them.
    """

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="rlx-pc-machine-"))
        self.budget = 6 * PC_BLOCK_BYTES + 5
        self.cache = PromptCache(self.budget, fingerprint=PC_FP, directory=self.dir)
        self.kv = KvCache(n_layers=1, n_kv_heads=1, head_dim=2, max_seq=96)
        self.tokens: list[int] = []
        self.next_token = 1
        self.damaged: set[tuple[int, ...]] = set()

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def entries(self) -> list[tuple[int, ...]]:
        return [e for e in self.cache._lru]

    @rule(n=st.integers(1, 40))
    def grow(self, n: int) -> None:
        n = min(n, 96 - len(self.tokens))
        for _ in range(n):
            t = self.next_token
            self.next_token += 1
            row = np.full((1, 1, 2), t, np.float32)
            self.kv.append(0, row, row)
            self.tokens.append(t)

    @rule(data=st.data())
    def backtrack(self, data: st.DataObject) -> None:
        n = data.draw(st.integers(0, len(self.tokens)))
        self.kv.truncate(n)
        del self.tokens[n:]

    @precondition(lambda self: self.tokens)
    @rule()
    def insert(self) -> None:
        snap = SessionSnapshot(self.kv.snapshot(), self.tokens, PC_FP)
        fits = -(-len(self.tokens) // 16) * PC_BLOCK_BYTES <= self.budget
        assert self.cache.insert(snap) == fits
        if fits:
            assert tuple(self.tokens) in self.cache
            self.damaged.discard(tuple(self.tokens))
        assert self.cache.stats().bytes <= self.budget

    @rule(data=st.data())
    def lookup(self, data: st.DataObject) -> None:
        known = self.entries()
        base = list(data.draw(st.sampled_from(known))) if known else []
        cut = data.draw(st.integers(0, len(base)))
        prompt = base[:cut] + data.draw(st.lists(st.integers(0, 300), max_size=3))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # damaged files are refused
            found, n = self.cache.lookup(prompt)
        if found is not None:
            assert n > 0
            assert found.tokens[:n] == tuple(prompt[:n])
            # (a damaged file may still be served whole: as a prefix of an intact relative)
            same(found.kv.keys(0)[0, :, 0], found.tokens)

    @rule()
    def reopen(self) -> None:
        before = set(self.entries())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            self.cache = PromptCache(self.budget, fingerprint=PC_FP, directory=self.dir)
        after = set(self.entries())
        assert after == before - self.damaged, "a reopen with the same budget lost entries"
        assert self.cache.stats().evictions == 0
        damaged_files = {self.dir / self.cache._file_name(t) for t in self.damaged}
        assert set(self.cache.refused) == {p for p in damaged_files if p.exists()}
        for path in self.cache.refused:
            path.unlink()  # the user cleans up what was refused
        self.damaged.clear()

    @precondition(lambda self: self.cache._lru)
    @rule(data=st.data(), how=st.sampled_from(["truncate", "flip", "garbage"]))
    def damage_a_file(self, data: st.DataObject, how: str) -> None:
        tokens = data.draw(st.sampled_from(self.entries()))
        entry = self.cache._lru[tokens]
        if entry.path is None or entry.snapshot is not None:
            return  # held in memory: the file is only read again after a reopen
        raw = entry.path.read_bytes()
        if how == "truncate":
            raw = raw[: len(raw) // 2]
        elif how == "flip":
            raw = raw[:-1] + bytes([raw[-1] ^ 1]) + b"x"
        else:
            raw = b"\0" * 8
        entry.path.write_bytes(raw)
        self.damaged.add(tokens)

    @invariant()
    def every_entry_on_disk_has_its_file(self) -> None:
        for tokens, entry in self.cache._lru.items():
            assert entry.path is not None, tokens
            assert entry.path.exists(), tokens
        names = {p.name for p in self.dir.iterdir() if p.name.endswith(".rlxkv")}
        assert {e.path.name for e in self.cache._lru.values() if e.path} <= names
        assert not [p for p in self.dir.iterdir() if p.name.endswith(".tmp")]


TestPromptCacheStateful = PromptCacheMachine.TestCase
_DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"  # make fuzz-io: the long campaign
TestPromptCacheStateful.settings = settings(
    stateful_step_count=60 if _DEEP else 30, max_examples=5000 if _DEEP else 30, deadline=None
)
