"""A short fuzz run of every file-reader target in tests/fuzz_io.py (seconds, in make check).

Inputs are the targets' valid seeds mutated by byte flips, insertions,
deletions, truncations and 8-byte integer overwrites (where headers keep their
lengths and counts), plus arbitrary bytes. ``make fuzz-io`` runs the same
targets coverage-guided with atheris for the long campaign.
"""

from __future__ import annotations

import struct

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
