"""PromptCache: longest prefix against brute force, the byte budget, persistence, the helper."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_toy_runner import VOCAB, ToyRunner

from rlx_lm import (
    InvalidOptionError,
    KvCache,
    ModelFingerprint,
    PromptCache,
    SessionSnapshot,
    SnapshotMismatchError,
    cached_prefill_logits,
)

FP = ModelFingerprint("tiny", (1, 1, 2), "m")
BLOCK = 16
BLOCK_BYTES = BLOCK * 2 * 1 * 2 * 4  # tokens x (k, v) x heads x head_dim x float32


def snap(tokens: Sequence[int], fp: ModelFingerprint | None = FP) -> SessionSnapshot:
    c = KvCache(n_layers=1, n_kv_heads=1, head_dim=2, max_seq=max(1, len(tokens)))
    rows = np.asarray(tokens, np.float32).reshape(1, -1, 1).repeat(2, axis=2)
    c.append(0, rows, -rows)
    return SessionSnapshot(c.snapshot(), tokens, fp)


def common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


token_lists = st.lists(st.integers(0, 3), min_size=1, max_size=10)


@given(st.lists(token_lists, max_size=12), st.lists(st.lists(st.integers(0, 3), max_size=12)))
def test_lookup_finds_the_longest_prefix_like_brute_force(
    entries: list[list[int]], prompts: list[list[int]]
) -> None:
    cache = PromptCache(1 << 30)
    for tokens in entries:
        assert cache.insert(snap(tokens))
    assert len(cache) == len({tuple(t) for t in entries})
    for prompt in [*prompts, *entries]:
        found, n = cache.lookup(prompt)
        best = max((common(prompt, e) for e in entries), default=0)
        assert n == best
        if best == 0:
            assert found is None
        else:
            assert found is not None
            assert found.tokens[:n] == tuple(prompt[:n])
            # The snapshot's rows are its own tokens, so they prove which entry came back.
            np.testing.assert_array_equal(found.kv.keys(0)[0, :, 0], found.tokens)


def test_removal_keeps_the_tree_exact() -> None:
    cache = PromptCache(3 * BLOCK_BYTES)  # three single-block entries fit
    for tokens in ([1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 9], [7]):
        cache.insert(snap(tokens))
    # [1, 2, 3, 4] was evicted (LRU); the rest must still be found exactly.
    assert [1, 2, 3, 4] not in cache
    assert cache.lookup([1, 2, 3, 4])[1] == 4 - 1  # via [1, 2, 3, 9]
    assert cache.lookup([1, 2, 5, 0])[1] == 3
    assert cache.lookup([7, 7])[1] == 1
    assert cache.lookup([8])[1] == 0


def expected_bytes(snapshots: dict[tuple[int, ...], SessionSnapshot], cache: PromptCache) -> int:
    per_slab: dict[int, tuple[int, int]] = {}
    for s in snapshots.values():
        if s.tokens not in cache:
            continue
        for slab, blocks, block_bytes in s.kv.storage():
            old = per_slab.get(slab, (0, block_bytes))[0]
            per_slab[slab] = (max(old, blocks), block_bytes)
    return sum(b * bb for b, bb in per_slab.values())


@settings(max_examples=60)
@given(
    st.integers(1, 12).map(lambda blocks: blocks * BLOCK_BYTES + 7),
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 70), st.booleans()), min_size=1, max_size=25
    ),
)
def test_budget_holds_after_every_insert_counting_shared_blocks_once(
    budget: int, ops: list[tuple[int, int, bool]]
) -> None:
    cache = PromptCache(budget)
    # Three live sequences; snapshots of one sequence share its slab.
    seqs = [KvCache(n_layers=1, n_kv_heads=1, head_dim=2, max_seq=80) for _ in range(3)]
    history: list[list[int]] = [[], [], []]
    inserted: dict[tuple[int, ...], SessionSnapshot] = {}  # the latest per token key
    for which, length, probe in ops:
        c, toks = seqs[which], history[which]
        if length < len(toks):  # later appends diverge from snapshots already taken
            c.truncate(length)
            del toks[length:]
        while len(toks) < length:
            t = 100 * which + len(toks)
            c.append(0, np.full((1, 1, 2), t, np.float32), np.full((1, 1, 2), t, np.float32))
            toks.append(t)
        s = SessionSnapshot(c.snapshot(), toks, FP)
        ok = cache.insert(s)
        assert ok == (-(-length // BLOCK) * BLOCK_BYTES <= budget)
        if ok:
            inserted[s.tokens] = s
            assert s.tokens in cache  # the newest entry is never the one evicted
        stats = cache.stats()
        assert stats.bytes <= budget
        # Cached prefixes of a newer entry become views of its rows, so the cache
        # never holds more than the snapshots inserted, and exactly what it holds.
        held = {e.tokens: e.snapshot for e in cache._lru.values() if e.snapshot is not None}
        assert stats.bytes == expected_bytes(held, cache) <= expected_bytes(inserted, cache)
        for tokens, held_snap in held.items():
            np.testing.assert_array_equal(held_snap.kv.keys(0)[0, :, 0], tokens)
        assert stats.blocks * BLOCK_BYTES == stats.bytes
        if probe:
            cache.lookup(toks[: length // 2 + 1])


def test_shared_prefix_is_counted_once() -> None:
    c = KvCache(n_layers=1, n_kv_heads=1, head_dim=2, max_seq=64)
    cache = PromptCache(1 << 20)
    for n in (16, 32, 48):
        while c.len() < n:
            c.append(0, np.zeros((1, 1, 2), np.float32), np.zeros((1, 1, 2), np.float32))
        cache.insert(SessionSnapshot(c.snapshot(), range(n), FP))
    assert cache.stats().bytes == 3 * BLOCK_BYTES  # not (1 + 2 + 3) blocks
    assert cache.kv_store_stats() == (3, 16 + 32 + 48, 0)


def test_lru_eviction_and_stats() -> None:
    cache = PromptCache(2 * BLOCK_BYTES)
    cache.insert(snap([1, 1]))
    cache.insert(snap([2, 2]))
    assert cache.lookup([1, 1, 5])[1] == 2  # touch [1, 1]
    cache.insert(snap([3, 3]))
    assert [2, 2] not in cache
    assert [1, 1] in cache
    assert cache.lookup([9])[0] is None
    s = cache.stats()
    assert (s.entries, s.tokens, s.bytes, s.hits, s.misses, s.evictions) == (
        2,
        4,
        2 * BLOCK_BYTES,
        1,
        1,
        1,
    )


def test_oversized_and_empty_snapshots_are_not_inserted() -> None:
    cache = PromptCache(BLOCK_BYTES)
    assert not cache.insert(snap(list(range(17))))
    assert not cache.insert(
        SessionSnapshot(KvCache(n_layers=1, n_kv_heads=1, head_dim=2, max_seq=1).snapshot(), [])
    )
    assert len(cache) == 0


def test_replacing_an_entry_with_the_same_tokens() -> None:
    cache = PromptCache(1 << 20)
    cache.insert(snap([4, 5]))
    newer = snap([4, 5])
    cache.insert(newer)
    assert len(cache) == 1
    assert cache.lookup([4, 5])[0] is newer
    assert cache.stats().bytes == BLOCK_BYTES


def test_fingerprints_and_options_are_checked() -> None:
    with pytest.raises(InvalidOptionError, match="budget_bytes"):
        PromptCache(0)
    with pytest.raises(InvalidOptionError, match="fingerprint"):
        PromptCache(10, directory="/nonexistent")
    cache = PromptCache(1 << 20)
    cache.insert(snap([1]))
    assert cache.fingerprint == FP  # bound by the first insert
    with pytest.raises(SnapshotMismatchError, match="model_id"):
        cache.insert(snap([2], ModelFingerprint("tiny", (1, 1, 2), "other")))
    with pytest.raises(SnapshotMismatchError):
        cache.insert(snap([2], None))
    with pytest.raises(TypeError):
        cache.insert(SessionSnapshot(None, [1]))
    assert len(cache) == 1


def test_persistence_survives_a_restart(tmp_path: Path) -> None:
    cache = PromptCache(1 << 20, fingerprint=FP, directory=tmp_path)
    for tokens in ([1, 2, 3], [1, 2, 4, 5], [9] * 20):
        cache.insert(snap(tokens))
    files = sorted(tmp_path.iterdir())
    assert len(files) == 3
    assert cache.stats().disk_bytes == sum(f.stat().st_size for f in files)
    before = cache.stats()

    again = PromptCache(1 << 20, fingerprint=FP, directory=tmp_path)
    assert len(again) == 3
    assert again.stats().bytes == before.bytes
    assert again.kv_store_stats() == cache.kv_store_stats()
    found, n = again.lookup([1, 2, 4, 5, 6])
    assert n == 4
    assert found is not None
    assert found.tokens == (1, 2, 4, 5)
    np.testing.assert_array_equal(found.kv.values(0)[0, :, 1], [-1, -2, -4, -5])
    assert again.stats().bytes == before.bytes  # loading does not change the count


def test_eviction_removes_the_file_and_a_smaller_budget_applies_on_open(tmp_path: Path) -> None:
    cache = PromptCache(2 * BLOCK_BYTES, fingerprint=FP, directory=tmp_path)
    for tokens in ([1], [2], [3]):
        cache.insert(snap(tokens))
    assert len(list(tmp_path.iterdir())) == 2
    small = PromptCache(BLOCK_BYTES, fingerprint=FP, directory=tmp_path)
    assert len(small) == 1
    assert small.lookup([3])[1] == 1  # the most recent survived
    assert len(list(tmp_path.iterdir())) == 1


def test_corrupt_and_foreign_files_are_refused_and_kept(tmp_path: Path) -> None:
    cache = PromptCache(1 << 20, fingerprint=FP, directory=tmp_path)
    cache.insert(snap([1, 2, 3]))
    cache.insert(snap([4, 5]))
    good = {p.name for p in tmp_path.iterdir()}
    corrupt = tmp_path / "corrupt.rlxkv"
    corrupt.write_bytes(next(tmp_path.iterdir()).read_bytes()[:-4])
    foreign = tmp_path / "foreign.rlxkv"
    snap([1, 2, 3, 4], ModelFingerprint("other", (1,), "x")).save(foreign)
    notes = tmp_path / "notes.txt"
    notes.write_text("not ours")
    contents = {p: p.read_bytes() for p in tmp_path.iterdir()}

    with pytest.warns(RuntimeWarning, match="refusing") as caught:
        again = PromptCache(1 << 20, fingerprint=FP, directory=tmp_path)
    assert len(caught) == 2
    assert set(again.refused) == {corrupt, foreign}
    assert "truncated" in again.refused[corrupt]
    assert "family" in again.refused[foreign]
    assert len(again) == 2
    assert again.lookup([1, 2, 3, 4])[1] == 3  # not the foreign file's 4
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == contents
    assert good <= {p.name for p in tmp_path.iterdir()}


def test_a_file_damaged_after_start_up_is_refused_at_lookup(tmp_path: Path) -> None:
    cache = PromptCache(1 << 20, fingerprint=FP, directory=tmp_path)
    cache.insert(snap([1, 2]))
    cache.insert(snap([1, 2, 3, 4]))
    again = PromptCache(1 << 20, fingerprint=FP, directory=tmp_path)
    victim = next(p for p in tmp_path.iterdir() if SessionSnapshot.load(p).tokens == (1, 2, 3, 4))
    damaged = victim.read_bytes()[:-1]
    victim.write_bytes(damaged)
    with pytest.warns(RuntimeWarning, match="refusing"):
        found, n = again.lookup([1, 2, 3, 4])
    assert n == 2
    assert found is not None
    assert found.tokens == (1, 2)
    assert victim.read_bytes() == damaged
    assert victim in again.refused
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert again.lookup([1, 2, 3, 4])[1] == 2  # refused once, not again


prompts = st.lists(
    st.lists(st.integers(0, 3), min_size=0, max_size=6).flatmap(
        lambda head: st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8).map(
            lambda tail: head + tail
        )
    ),
    min_size=1,
    max_size=6,
)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@settings(max_examples=30)
@given(prompt_list=prompts)
def test_cached_prefill_equals_a_fresh_prefill(dtype: str, prompt_list: list[list[int]]) -> None:
    runner = ToyRunner(seed=3, dtype=dtype)
    fresh = ToyRunner(seed=3, dtype=dtype)
    tol = 1e-4 if dtype == "float32" else 2e-2  # the reference keeps float32 keys and values
    # A suffix-only prefill multiplies fewer rows, so BLAS may round a key differently in the
    # last float32 bit, and that can flip its float16 rounding: one float16 ulp, not more.
    same = 1e-5 if dtype == "float32" else 1e-3
    cache = PromptCache(1 << 20, fingerprint=runner.fingerprint)
    for prompt in prompt_list:
        longest = max((common(prompt, e) for e in cache_tokens(cache)), default=0)
        expect_reuse = min(longest, len(prompt) - 1)
        got = cached_prefill_logits(runner, prompt, cache)
        np.testing.assert_allclose(got, fresh.prefill_logits(prompt), rtol=same, atol=same)
        np.testing.assert_allclose(got, fresh.reference_logits(prompt), rtol=tol, atol=tol)
        assert runner.prefill_calls[-1] == len(prompt) - expect_reuse  # only the suffix ran
        assert tuple(prompt) in cache
        # The runner's session continues correctly after a reused prefill.
        tok = int(np.argmax(got)) % VOCAB
        np.testing.assert_allclose(
            runner.decode_logits(tok), fresh.reference_logits([*prompt, tok]), rtol=tol, atol=tol
        )


def cache_tokens(cache: PromptCache) -> list[tuple[int, ...]]:
    return list(cache._lru)


def test_cached_prefill_rejects_an_empty_prompt() -> None:
    runner = ToyRunner()
    with pytest.raises(InvalidOptionError, match="empty"):
        cached_prefill_logits(runner, [], PromptCache(1 << 20))
