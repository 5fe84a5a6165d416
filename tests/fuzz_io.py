"""Fuzz targets for the file readers: GGUF, safetensors, session snapshots, the prompt-cache
directory loader and the pickled KV state, and a GGUF file loaded onto the engine.

Each target takes bytes and either accepts them, checking invariants of what
it read, or refuses them with the typed error that reader promises; anything
else (another exception, a crash, a hang) is a finding. The same targets run
two ways:

* ``tests/test_fuzz_io.py`` drives them with hypothesis for a few seconds in
  ``make check`` (no extra dependency, deterministic in CI);
* ``python tests/fuzz_io.py TARGET [libFuzzer flags]`` drives them with
  atheris (``pip install -e '.[fuzz]'``), coverage-guided over the Python
  bytecode, for the long campaign of ``make fuzz-io``.

The readers are Python (the header walkers) over Rust (the KV rows), so a
Python-level fuzzer reaches both; the Rust state reader also has a cargo-fuzz
target (``fuzz/``) for the pure-Rust half.
"""

from __future__ import annotations

if __name__ == "__main__":  # pragma: no cover - atheris: instrument rlx_lm only, before import
    import atheris

    with atheris.instrument_imports(include=["rlx_lm"]):
        import rlx_lm._headers
        import rlx_lm.prompt_cache
        import rlx_lm.runners.llama
        import rlx_lm.session  # noqa: F401

import io
import json
import os
import shutil
import struct
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rlx_lm import (
    KvCache,
    ModelFingerprint,
    PromptCache,
    SessionSnapshot,
    UnsupportedError,
    WeightFormatError,
)
from rlx_lm._core import _kv_snapshot_from_state
from rlx_lm._headers import parse_safetensors_header, walk_gguf

FP = ModelFingerprint("fuzz", (2, 1, 2), "m")
SPLIT = b"\xff\xfe--rlxkv--\xfe\xff"
"""Separates the files of one prompt-cache directory input."""
_PATH = Path("<fuzz>")


def gguf_header(data: bytes) -> None:
    """The GGUF walker: refuse with WeightFormatError, or return ranges inside the file."""
    try:
        header = walk_gguf(data, _PATH, arrays=True)
    except WeightFormatError:
        return
    assert header.data_offset <= max(len(data), header.data_offset)
    for t in header.tensors:
        assert header.data_offset + t.offset + t.n_bytes <= len(data)
    for key, values in header.arrays.items():  # flat arrays are kept, nested ones skipped
        assert len(values) == header.array_lengths[key]


def safetensors_header(data: bytes) -> None:
    """The safetensors header reader: refuse with WeightFormatError, or ranges inside the data."""
    try:
        header = parse_safetensors_header(io.BytesIO(data), len(data), _PATH)
    except WeightFormatError:
        return
    size = len(data) - header.data_offset
    assert set(header.offsets) == set(header.tensors)
    for begin, end in header.offsets.values():
        assert 0 <= begin <= end <= size


def _memfile(data: bytes) -> tuple[int, str]:
    fd = os.memfd_create("rlx-fuzz") if hasattr(os, "memfd_create") else -1
    if fd < 0:  # pragma: no cover - non-Linux
        with tempfile.NamedTemporaryFile(delete=False) as f:
            f.write(data)
        return -1, f.name
    os.write(fd, data)
    return fd, f"/proc/self/fd/{fd}"


def snapshot_file(data: bytes) -> None:
    """SessionSnapshot.load: refuse with WeightFormatError, or rows that save back the same."""
    fd, path = _memfile(data)
    try:
        try:
            snap = SessionSnapshot.load(path)
        except WeightFormatError:
            return
    finally:
        if fd >= 0:
            os.close(fd)
        else:  # pragma: no cover
            os.unlink(path)
    assert snap.kv.len() == len(snap.tokens)
    out = tempfile.mkdtemp(prefix="rlx-fuzz-")
    try:
        again = SessionSnapshot.load(_resaved(snap, Path(out)))
        assert again.tokens == snap.tokens
        assert again.fingerprint == snap.fingerprint
        for layer in range(snap.kv.n_layers):
            np.testing.assert_array_equal(again.kv.keys(layer), snap.kv.keys(layer))
            np.testing.assert_array_equal(again.kv.values(layer), snap.kv.values(layer))
    finally:
        shutil.rmtree(out)


def _resaved(snap: SessionSnapshot, directory: Path) -> Path:
    path = directory / "again.rlxkv"
    snap.save(path, durable=False)
    return path


def kv_state(data: bytes) -> None:
    """The pickled KV state reader (Rust): refuse with WeightFormatError, or a consistent one."""
    try:
        kv = _kv_snapshot_from_state(data)
    except WeightFormatError:
        return
    assert kv.nbytes == kv.len() * 2 * kv.n_layers * kv.n_kv_heads * kv.head_dim * (
        4 if kv.dtype == "float32" else 2
    )
    assert _kv_snapshot_from_state(kv.__reduce__()[1][0]).len() == kv.len()


_CACHE_DIR: list[Path] = []


def cache_directory(data: bytes) -> None:
    """PromptCache(directory=...): always opens; refuses bad files, deletes none that fit."""
    if not _CACHE_DIR:
        # In memory where the machine has it: on a disk, writing and unlinking four
        # files per execution ran 437/s; on /dev/shm, 3,300/s.
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        _CACHE_DIR.append(Path(tempfile.mkdtemp(prefix="rlx-fuzz-cache-", dir=shm)))
    d = _CACHE_DIR[0]
    for p in d.iterdir():
        p.unlink()
    pieces = data.split(SPLIT)[:4]
    for i, piece in enumerate(pieces):
        (d / f"{i:040d}.rlxkv").write_bytes(piece)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        cache = PromptCache(1 << 30, fingerprint=FP, directory=d)
        assert len(cache) + len(cache.refused) <= len(pieces)
        for i in range(len(pieces)):
            path = d / f"{i:040d}.rlxkv"
            if path in cache.refused:
                continue
            try:
                tokens = SessionSnapshot.load(path).tokens
            except WeightFormatError:
                continue
            found, n = cache.lookup(tokens)
            assert found is not None
            assert n == len(tokens)
            assert found.tokens[:n] == tokens
    assert len(list(d.iterdir())) == len(pieces)  # nothing within budget is deleted


def gguf_engine(data: bytes) -> None:
    """A GGUF file through ``load_llama`` onto the Rust engine: refused with WeightFormatError
    or UnsupportedError (the file is the problem, whatever it lies about), or a runner that
    answers a prefill and a decode with one logit per token of its vocabulary. The file is
    never changed."""
    from rlx_lm.runners.llama import load_llama

    fd, path = _memfile(data)
    try:
        try:
            runner = load_llama(path, max_seq=4, threads=1)
        except (WeightFormatError, UnsupportedError):
            return
        vocab = runner.vocab_size
        assert runner.prefill_logits([0, vocab - 1]).shape == (vocab,)
        assert runner.decode_logits(vocab // 2).shape == (vocab,)
        assert len(runner.tokens) == 3
    finally:
        with open(path, "rb") as f:
            assert f.read() == data, "the model file was changed"
        if fd >= 0:
            os.close(fd)
        else:  # pragma: no cover
            os.unlink(path)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "gguf": gguf_header,
    "safetensors": safetensors_header,
    "snapshot": snapshot_file,
    "kv_state": kv_state,
    "cache_dir": cache_directory,
    "gguf_engine": gguf_engine,
}


# -- seeds ------------------------------------------------------------------------------


def _snapshot(tokens: list[int], dtype: str = "float32") -> SessionSnapshot:
    c = KvCache(n_layers=2, n_kv_heads=1, head_dim=2, max_seq=max(4, len(tokens)), dtype=dtype)
    rows = np.asarray(tokens, np.float32).reshape(1, -1, 1).repeat(2, axis=2)
    for layer in range(2):
        c.append(layer, rows, -rows)
    return SessionSnapshot(c.snapshot(), tokens, FP)


def _snapshot_bytes(tokens: list[int], dtype: str = "float32") -> bytes:
    d = Path(tempfile.mkdtemp(prefix="rlx-fuzz-seed-"))
    try:
        path = d / "s.rlxkv"
        _snapshot(tokens, dtype).save(path, durable=False)
        return path.read_bytes()
    finally:
        shutil.rmtree(d)


def _gguf_seed() -> bytes:
    def s(text: str) -> bytes:
        raw = text.encode()
        return struct.pack("<Q", len(raw)) + raw

    kv = (
        s("general.architecture")
        + struct.pack("<I", 8)
        + s("llama")
        + s("tokenizer.ggml.tokens")
        + struct.pack("<IIQ", 9, 8, 2)
        + s("a")
        + s("b")
        + s("tokenizer.ggml.scores")
        + struct.pack("<IIQ", 9, 6, 2)
        + struct.pack("<ff", 0.0, -1.0)
        + s("llama.block_count")
        + struct.pack("<II", 4, 1)
    )
    tensor = s("w") + struct.pack("<I", 2) + struct.pack("<QQ", 4, 2) + struct.pack("<IQ", 0, 0)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 4) + kv + tensor
    head += b"\0" * (-len(head) % 32)
    return head + np.arange(8, dtype=np.float32).tobytes()


def _safetensors_seed() -> bytes:
    header = {
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]},
    }
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(22)


def _model_seed(qtype: str, hidden: int, vocab: int, tie: bool) -> bytes:
    from model_factory import make_tiny, write_gguf

    d = Path(tempfile.mkdtemp(prefix="rlx-fuzz-seed-"))
    try:
        model = make_tiny(
            "llama",
            hidden=hidden,
            layers=1,
            heads=2,
            kv_heads=1,
            inter=hidden,
            vocab=vocab,
            tie=tie,
        )
        return write_gguf(model, d / "m.gguf", qtype=qtype).read_bytes()
    finally:
        shutil.rmtree(d)


def seeds(target: str) -> list[bytes]:
    """Valid inputs for a target, for mutation."""
    if target == "gguf_engine":
        return [_model_seed("F32", 8, 8, False), _model_seed("Q8_0", 32, 16, True)]
    if target == "gguf":
        return [_gguf_seed()]
    if target == "safetensors":
        return [_safetensors_seed()]
    if target == "snapshot":
        return [_snapshot_bytes([1, 2, 3]), _snapshot_bytes([5] * 20, "float16")]
    if target == "kv_state":
        return [_snapshot([1, 2, 3]).kv.__reduce__()[1][0]]
    if target == "cache_dir":
        return [
            SPLIT.join(
                [_snapshot_bytes([1, 2, 3]), _snapshot_bytes([1, 2, 3, 4, 5]), _snapshot_bytes([9])]
            )
        ]
    raise KeyError(target)


def limit_address_space(gib: float) -> None:
    """Cap the address space the process may map at ``gib`` GiB (0: no cap).

    libFuzzer's ``-rss_limit_mb`` sees only the memory a target touches; a reservation sized
    by a header field is not touched until written, so a 32 KB KV state that reserved 512 GiB
    passed 11.8 million executions unseen. Under this cap such a reservation fails at once,
    and the target sees an error other than the one its reader promises: a finding."""
    import resource

    if gib > 0:
        cap = int(gib * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def main(argv: list[str]) -> None:  # pragma: no cover - the atheris driver
    import atheris

    if len(argv) < 2 or argv[1] not in TARGETS:
        raise SystemExit(f"usage: {argv[0]} {{{'|'.join(TARGETS)}}} [libFuzzer flags]")
    # A few hundred MB is the interpreter, numpy and the engine's threads.
    limit_address_space(float(os.environ.get("RLX_FUZZ_AS_GB", "4")))
    name = argv[1]
    target = TARGETS[name]
    corpus = Path(os.environ.get("RLX_FUZZ_CORPUS", "fuzz/corpus")) / name
    corpus.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(seeds(name)):
        (corpus / f"seed-{i}").write_bytes(seed)
    atheris.Setup([argv[0], str(corpus), *argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv)
