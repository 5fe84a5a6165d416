"""A short fuzz run of every file-reader target in tests/fuzz_io.py (seconds, in make check).

Inputs are the targets' valid seeds mutated by byte flips, insertions,
deletions, truncations and 8-byte integer overwrites (where headers keep their
lengths and counts), plus arbitrary bytes. ``make fuzz-io`` runs the same
targets coverage-guided with atheris for the long campaign.
"""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
from fuzz_io import TARGETS, seeds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

_EDGE_INTS = [0, 1, 2, 7, 8, 255, 2**31 - 1, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**64 - 1]

_edit = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 16), st.integers(0, 255)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 16), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 16), st.integers(1, 64)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 16), st.just(0)),
    st.tuples(st.just("u64"), st.integers(0, 1 << 16), st.sampled_from(_EDGE_INTS)),
    st.tuples(st.just("u32"), st.integers(0, 1 << 16), st.sampled_from(_EDGE_INTS)),
)


def _mutate(seed: bytes, edits: list[tuple[str, int, object]]) -> bytes:
    data = bytearray(seed)
    for op, where, arg in edits:
        at = where % (len(data) + 1)
        if op == "flip" and data:
            data[at % len(data)] ^= int(arg)  # type: ignore[call-overload]
        elif op == "insert":
            data[at:at] = arg  # type: ignore[index]
        elif op == "delete":
            del data[at : at + int(arg)]  # type: ignore[call-overload]
        elif op == "truncate":
            del data[at:]
        elif op in ("u64", "u32"):
            fmt = "<Q" if op == "u64" else "<I"
            packed = struct.pack(fmt, int(arg) % (1 << (64 if op == "u64" else 32)))  # type: ignore[call-overload]
            data[at : at + len(packed)] = packed
    return bytes(data)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_seeds_are_accepted(name: str) -> None:
    for seed in seeds(name):
        TARGETS[name](seed)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_mutated_inputs_are_accepted_or_refused_typed(name: str) -> None:
    pool = seeds(name)

    @settings(
        max_examples={"cache_dir": 40, "gguf_engine": 100}.get(name, 150),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
    )
    @given(
        st.one_of(
            st.builds(_mutate, st.sampled_from(pool), st.lists(_edit, min_size=1, max_size=6)),
            st.binary(max_size=256),
        )
    )
    def run(data: bytes) -> None:
        TARGETS[name](data)

    run()


_CAPPED = """
import struct, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import fuzz_io
fuzz_io.limit_address_space(2)
try:
    np.ones(3 << 28, dtype=np.uint8)  # 768 MiB: fits under the cap
    np.empty(1 << 32, dtype=np.uint8)  # 4 GiB of address space: does not
except MemoryError:
    pass
else:
    raise SystemExit("a 4 GiB reservation passed a 2 GiB cap")
# A state whose header claims 2^24 tokens over 4096 layers: its rows, not its claim.
layers = 4096
state = b"RLXKVSN1" + struct.pack("<6Q", layers, 1, 1, 0, 1 << 24, 1)
fuzz_io.TARGETS["kv_state"](state + np.arange(2 * layers, dtype="<f4").tobytes())
print("ok")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS as Linux enforces it")
def test_the_campaign_caps_address_space_so_reservations_are_findings() -> None:
    """The atheris driver caps the address space (``RLX_FUZZ_AS_GB``): a reservation sized by
    a header (untouched, so invisible to ``-rss_limit_mb``) fails at once and the target sees
    it. Before its fix, the KV state below failed here with InvalidOptionError."""
    done = subprocess.run(
        [sys.executable, "-c", _CAPPED, str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
