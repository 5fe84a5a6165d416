"""Snapshot files and persistent prompt caches under hostile files, faults and races.

One test per trigger of issue 16's persistence and snapshot findings: a tiny
header declaring a billion layers, a load racing a re-save, modes, temporary
files of killed saves, files that could never be loaded, a reopen evicting
what fits, a full disk under generate(), and float16/float32 runners sharing
a cache.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import stat
import struct
import subprocess
import sys
import tracemalloc
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from model_factory import make_tiny, write_gguf
from tokenizer_factory import spm_gguf_fields, spm_vocab

import rlx_lm.session as session_mod
from rlx_lm import (
    InvalidOptionError,
    KvCache,
    KvSnapshot,
    ModelFingerprint,
    PromptCache,
    SessionSnapshot,
    WeightFormatError,
)
from rlx_lm._core import KV_MAX_SEQ, _kv_snapshot_from_state
from rlx_lm.generation import generate, stream
from rlx_lm.runners.llama import load_llama
from rlx_lm.session import read_header, reclaim_temp_files
from rlx_lm.tokenizer import Tokenizer

FP = ModelFingerprint("tiny", (1, 1, 2), "m")


def snap(tokens: Sequence[int], tag: float = 0.0, cache: KvCache | None = None) -> SessionSnapshot:
    if cache is None:  # not `cache or`: an empty cache is falsy
        cache = KvCache(n_layers=2, n_kv_heads=1, head_dim=2, max_seq=max(1, len(tokens)))
    c = cache
    rows = (np.asarray(tokens, np.float32) + tag).reshape(1, -1, 1).repeat(2, axis=2)
    for layer in range(c.n_layers):
        c.append(layer, rows, -rows)
    return SessionSnapshot(c.snapshot(), tokens, FP)


def hostile_header(meta: dict[str, str], tensors: dict[str, Any] | None = None) -> bytes:
    doc: dict[str, Any] = {"__metadata__": meta, **(tensors or {})}
    raw = json.dumps(doc, separators=(",", ":")).encode()
    return struct.pack("<Q", len(raw)) + raw


BILLION_LAYERS = {
    "format": "rlx_lm.session",
    "version": "1",
    "n_layers": "1000000000",
    "n_kv_heads": "1",
    "head_dim": "1",
    "dtype": "float32",
    "max_seq": "1",
    "tokens": "[]",
    "fingerprint": "null",
}


def test_a_tiny_header_declaring_a_billion_layers_is_refused_without_memory(
    tmp_path: Path,
) -> None:
    path = tmp_path / "evil.rlxkv"
    path.write_bytes(hostile_header(BILLION_LAYERS))
    assert path.stat().st_size < 300
    tracemalloc.start()
    try:
        with pytest.raises(WeightFormatError, match="n_layers"):
            SessionSnapshot.load(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    # Within the core's limit, a layer count the tensors do not match is refused too.
    path.write_bytes(hostile_header({**BILLION_LAYERS, "n_layers": "4000"}))
    with pytest.raises(WeightFormatError, match="0 tensors for the declared 4000 layers"):
        read_header(path)


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmSize from /proc")
def test_a_loaded_snapshot_reserves_its_rows_not_its_claimed_capacity(tmp_path: Path) -> None:
    """A snapshot read from outside (a pickled state or a file) holds the rows it brought:
    a 32 KB state claiming max_seq = 2^24 over 4096 layers reserved 512 GiB of address
    space, one slab of max_seq rows a layer (issue 16)."""
    layers = 4096
    state = b"RLXKVSN1" + struct.pack("<6Q", layers, 1, 1, 0, KV_MAX_SEQ, 1)
    state += np.arange(2 * layers, dtype="<f4").tobytes()
    assert len(state) < 40_000
    before = _vm_size()
    kv = pickle.loads(pickle.dumps(_kv_snapshot_from_state(state)))
    assert (len(kv), kv.max_seq, kv.n_layers) == (1, KV_MAX_SEQ, layers)
    assert _vm_size() - before < 1 << 30
    # The same claim in a session file: the header edited to the largest max_seq.
    path = tmp_path / "wide.rlxkv"
    cache = KvCache(n_layers=512, n_kv_heads=1, head_dim=2, max_seq=4)
    snap([5, 6], cache=cache).save(path)
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    doc = json.loads(raw[8 : 8 + n])
    doc["__metadata__"]["max_seq"] = str(KV_MAX_SEQ)
    header = json.dumps(doc, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + raw[8 + n :])
    before = _vm_size()
    loaded = SessionSnapshot.load(path)
    assert list(loaded.tokens) == [5, 6]
    assert loaded.kv.max_seq == KV_MAX_SEQ
    assert _vm_size() - before < 1 << 30
    # It still restores and grows: the layer moves to the cache's own slab.
    back = KvCache(n_layers=512, n_kv_heads=1, head_dim=2, max_seq=8)
    back.restore(loaded.kv)
    back.append(0, np.full((1, 1, 2), 7, np.float32), np.full((1, 1, 2), 7, np.float32))
    assert back.keys(0)[0, :, 0].tolist() == [5.0, 6.0, 7.0]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("n_kv_heads", "9" * 400),  # an int too large for the core: no OverflowError
        ("head_dim", "\u00b2"),  # a Unicode digit str.isdigit() accepts
        ("max_seq", str(KV_MAX_SEQ + 1)),
        ("tokens", "[" * 100_000),  # nesting: no RecursionError
        ("fingerprint", "[" * 100_000),
        ("tokens", "[18446744073709551616]"),  # a token id past int64
    ],
)
def test_hostile_header_fields_raise_weight_format_errors(
    tmp_path: Path, key: str, value: str
) -> None:
    path = tmp_path / "evil.rlxkv"
    meta = {**BILLION_LAYERS, "n_layers": "1", key: value}
    path.write_bytes(hostile_header(meta))
    with pytest.raises(WeightFormatError):
        SessionSnapshot.load(path)


def test_deeply_nested_safetensors_header_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "nested.rlxkv"
    raw = b"[" * 200_000
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(WeightFormatError, match="nests JSON too deeply"):
        SessionSnapshot.load(path)


def test_one_hostile_file_does_not_make_the_cache_directory_unopenable(tmp_path: Path) -> None:
    good = PromptCache(1 << 20, fingerprint=FP, directory=tmp_path)
    assert good.insert(snap([1, 2, 3]))
    (tmp_path / ("0" * 40 + ".rlxkv")).write_bytes(hostile_header(BILLION_LAYERS))
    with pytest.warns(RuntimeWarning, match="refusing"):
        reopened = PromptCache(1 << 20, fingerprint=FP, directory=tmp_path)
    assert len(reopened) == 1
    assert len(reopened.refused) == 1
    found, n = reopened.lookup([1, 2, 3, 4])
    assert found is not None
    assert n == 3


def test_a_load_racing_a_resave_reads_one_file_consistently(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.rlxkv"
    first, second = snap([1, 2, 3], tag=0.0), snap([7, 8, 9, 10, 11], tag=50.0)
    first.save(path)
    read_rows = session_mod._read_rows
    raced: list[bool] = []

    def resave_then_read(f: Any, info: Any) -> KvSnapshot:
        second.save(path)  # the file is replaced between the header and the rows
        raced.append(True)
        return read_rows(f, info)

    monkeypatch.setattr(session_mod, "_read_rows", resave_then_read)
    loaded = SessionSnapshot.load(path)
    monkeypatch.undo()
    assert raced == [True]  # the race happened: the load read its rows through the hook
    assert loaded.tokens == (1, 2, 3)
    np.testing.assert_array_equal(loaded.kv.keys(1)[0, :, 0], [1, 2, 3])
    again = SessionSnapshot.load(path)  # the new file is whole too
    assert again.tokens == second.tokens
    np.testing.assert_array_equal(again.kv.keys(0)[0, :, 0], np.add(second.tokens, 50.0))


def test_save_keeps_the_mode_of_the_file_it_replaces(tmp_path: Path) -> None:
    path = tmp_path / "s.rlxkv"
    snap([1, 2]).save(path)
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    path.chmod(0o640)
    snap([1, 2, 3]).save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    path.chmod(0o604)
    PromptCache(1 << 20, fingerprint=FP, directory=tmp_path / "d").insert(snap([4]))
    mode = {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "d").iterdir()}
    assert mode == {0o666 & ~umask}


_KILLED_SAVE = """
import os, sys
import numpy as np
import rlx_lm.session as s
from rlx_lm import KvCache, SessionSnapshot
class Dies:
    def __init__(self, kv): self.kv = kv
    def __getattr__(self, name): return getattr(self.kv, name)
    def _write_data(self, fd, offset): os._exit(9)  # killed mid-write
c = KvCache(n_layers=1, n_kv_heads=1, head_dim=2, max_seq=4)
c.append(0, np.ones((1, 2, 2), np.float32), np.ones((1, 2, 2), np.float32))
snap = SessionSnapshot(c.snapshot(), [1, 2])
s.SessionSnapshot._kv = lambda self: Dies(self.kv)
snap.save(sys.argv[1])
"""


def test_temporary_files_of_a_killed_save_are_reclaimed(tmp_path: Path) -> None:
    target = tmp_path / ("a" * 40 + ".rlxkv")
    done = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(target)], check=False)
    assert done.returncode == 9
    leftovers = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(leftovers) == 1
    assert not target.exists()
    # Our own in-flight temporary file (our pid) is never taken for a dead one.
    ours = tmp_path / f".{target.name}.{os.getpid()}.abcdefgh.tmp"
    ours.write_bytes(b"in progress")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache = PromptCache(1 << 20, fingerprint=FP, directory=tmp_path)
    assert not leftovers[0].exists()
    assert ours.exists()
    assert len(cache) == 0
    # A plain save reclaims the ones left for its own target.
    dead = tmp_path / f".{target.name}.{_dead_pid()}.zzzzzzzz.tmp"
    dead.write_bytes(b"x")
    snap([5]).save(target)
    assert not dead.exists()
    assert ours.exists()
    assert reclaim_temp_files(tmp_path) == []


def _dead_pid() -> int:
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(child.stdout)


def test_a_snapshot_that_could_not_be_loaded_is_never_saved(tmp_path: Path) -> None:
    # A cache larger than any loadable snapshot cannot be made in the first place...
    with pytest.raises(InvalidOptionError, match="max_seq"):
        KvCache(n_layers=1, n_kv_heads=1, head_dim=2, max_seq=KV_MAX_SEQ + 1)
    # ...and tokens a file cannot hold are refused before anything is written.
    c = KvCache(n_layers=1, n_kv_heads=1, head_dim=2, max_seq=4)
    c.append(0, np.ones((1, 2, 2), np.float32), np.ones((1, 2, 2), np.float32))
    for tokens in ([-1, 2], [1, 1 << 64]):
        bad = SessionSnapshot(c.snapshot(), tokens)
        with pytest.raises(InvalidOptionError, match="could not be loaded back"):
            bad.save(tmp_path / "never.rlxkv")
    assert list(tmp_path.iterdir()) == []


def test_reopening_with_the_same_budget_keeps_every_entry(tmp_path: Path) -> None:
    """A session snapshotted as it grows shares one slab: counted once in memory, and
    once again after a restart, so a reopen deletes nothing that fitted."""
    c = KvCache(n_layers=2, n_kv_heads=1, head_dim=2, max_seq=64)
    block_bytes = 16 * 2 * 1 * 2 * 4
    budget = 2 * 4 * block_bytes  # 2 layers x 4 blocks: the longest entry alone
    cache = PromptCache(budget, fingerprint=FP, directory=tmp_path)
    tokens: list[int] = []
    for n in (10, 20, 40, 64):
        while len(tokens) < n:
            rows = np.full((1, 1, 2), len(tokens), np.float32)
            for layer in range(2):
                c.append(layer, rows, rows)
            tokens.append(len(tokens))
        assert cache.insert(SessionSnapshot(c.snapshot(), tokens, FP))
    assert len(cache) == 4
    assert cache.stats().evictions == 0
    files = sorted(tmp_path.iterdir())
    assert len(files) == 4
    reopened = PromptCache(budget, fingerprint=FP, directory=tmp_path)
    assert len(reopened) == 4
    assert reopened.stats().bytes <= budget
    for n in (10, 40, 20, 64, 10):  # loading them never deletes a file either
        found, got = reopened.lookup(list(range(n)))
        assert found is not None
        assert got == n
        np.testing.assert_array_equal(found.kv.keys(1)[0, :, 0], range(len(found.tokens)))
        assert reopened.stats().bytes <= budget
    assert sorted(tmp_path.iterdir()) == files
    assert reopened.stats().evictions == 0


TOKENS, _, _ = spm_vocab()


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("faults") / "m.gguf"
    return write_gguf(
        make_tiny("llama", seed=8, vocab=len(TOKENS)), path, tokenizer=spm_gguf_fields()
    )


def test_a_full_disk_under_a_persistent_cache_does_not_cost_the_result(
    spm_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = Tokenizer.load(spm_model)
    runner = load_llama(spm_model, max_seq=64)
    want = generate(runner, tok, "hello world", max_tokens=6)

    def full_disk(self: SessionSnapshot, path: Any, *, durable: bool = True) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(SessionSnapshot, "save", full_disk)
    cache = PromptCache(1 << 26, fingerprint=runner.fingerprint, directory=tmp_path)
    with pytest.warns(RuntimeWarning, match="No space left on device"):
        got = generate(runner, tok, "hello world", max_tokens=6, prompt_cache=cache)
    assert got.tokens == want.tokens
    assert got.text == want.text
    assert cache.stats().write_failures >= 1
    assert len(cache) >= 1  # kept in memory, and used
    with pytest.warns(RuntimeWarning, match="could not write"):
        again = generate(runner, tok, "hello world", max_tokens=6, prompt_cache=cache)
    assert again.tokens == want.tokens
    assert again.reused_tokens > 0
    assert list(tmp_path.iterdir()) == []
    # stream() too: every chunk reaches the caller, and the text is generate()'s.
    fresh = PromptCache(1 << 26, fingerprint=runner.fingerprint, directory=tmp_path)
    with pytest.warns(RuntimeWarning, match="No space left on device"):
        chunks = list(stream(runner, tok, "hello world", max_tokens=6, prompt_cache=fresh))
    assert [c.token for c in chunks if c.token is not None] == list(want.tokens)
    assert "".join(c.text for c in chunks) == want.text
    assert fresh.stats().write_failures >= 1


def test_float16_and_float32_runners_sharing_a_cache_both_generate(
    spm_model: Path, tmp_path: Path
) -> None:
    tok = Tokenizer.load(spm_model)
    r32 = load_llama(spm_model, max_seq=64)
    r16 = load_llama(spm_model, max_seq=64, kv_dtype="float16")
    assert r32.fingerprint != r16.fingerprint
    assert r32.fingerprint.mismatch(r16.fingerprint) is not None
    cache = PromptCache(1 << 26)
    first = generate(r32, tok, "hello world", max_tokens=6, prompt_cache=cache)
    with pytest.warns(RuntimeWarning, match="prompt cache"):
        second = generate(r16, tok, "hello world", max_tokens=6, prompt_cache=cache)
    assert second.tokens
    assert second.reused_tokens == 0
    assert first.tokens[:2] == second.tokens[:2]
    # A persistent cache bound to one dtype refuses the other's files, untouched.
    disk = PromptCache(1 << 26, fingerprint=r32.fingerprint, directory=tmp_path)
    generate(r32, tok, "hello world", max_tokens=3, prompt_cache=disk)
    with pytest.warns(RuntimeWarning, match="kv_dtype"):
        other = PromptCache(1 << 26, fingerprint=r16.fingerprint, directory=tmp_path)
    assert len(other) == 0
    assert len(other.refused) == len(list(tmp_path.iterdir()))
