"""GGUF weights used in place: the Rust kernels against gguf's own dequantiser.

Every supported format is checked on random blocks (arbitrary bits, finite scales) and odd
shapes: ``quant_rows`` must return gguf's float32 values bit for bit, and ``quant_matmul`` must
equal a float64 product of those values within the float32 accumulation bound. One activation
row's result must not depend on the batch it is in, its place there, or the thread count.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize, quantize
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy_llama.linear import PackedMatrix

from rlx_lm._core import quant_matmul, quant_rows, quant_simd
from rlx_lm.errors import (
    DtypeError,
    InvalidOptionError,
    ShapeError,
    TokenOutOfRangeError,
)

T = gguf.GGMLQuantizationType


def _mxfp4_missing() -> str | None:
    """Why this gguf cannot be MXFP4's reference (None: it can). gguf-py learnt MXFP4 (ggml
    type 39, gpt-oss's expert weights) after 0.11, the lowest version CI tests."""
    qt = getattr(T, "MXFP4", None)
    if qt is None:
        return "this gguf has no MXFP4 type (GGMLQuantizationType.MXFP4)"
    try:
        dequantize(np.zeros((1, 17), np.uint8), qt)
        quantize(np.zeros((1, 32), np.float32), qt)
    except (NotImplementedError, KeyError, ValueError) as e:
        return f"gguf.quants cannot (de)quantize MXFP4 here ({type(e).__name__}: {e})"
    return None


#: Why the MXFP4 cases are skipped (an old gguf), or None.
MXFP4_MISSING = _mxfp4_missing()

QTYPES = [
    T.F32,
    T.F16,
    T.BF16,
    T.Q4_0,
    T.Q4_1,
    T.Q5_0,
    T.Q5_1,
    T.Q8_0,
    T.Q2_K,
    T.Q3_K,
    T.Q4_K,
    T.Q5_K,
    T.Q6_K,
    T.IQ4_NL,
    T.IQ4_XS,
    *([] if MXFP4_MISSING else [T.MXFP4]),
]


def params(qtypes: list[T]) -> list[Any]:
    """``qtypes`` for ``pytest.mark.parametrize``, with MXFP4 as a skipped case (and why)
    when this gguf cannot check it."""
    cases: list[Any] = [pytest.param(t, id=t.name) for t in qtypes]
    if MXFP4_MISSING:
        cases.append(pytest.param(None, id="MXFP4", marks=pytest.mark.skip(reason=MXFP4_MISSING)))
    return cases


#: Byte offsets of each block's float16 scales (d, dmin, m).
HALVES = {
    T.Q4_1: (0, 2),
    T.Q5_1: (0, 2),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q6_K: (208,),
}


def random_blocks(qtype: T, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random bytes for ``rows`` x ``cols`` values: arbitrary codes, finite small scales."""
    rng = np.random.default_rng(seed)
    values, size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype in (T.F32, T.F16):
        dtype = np.float32 if qtype == T.F32 else np.float16
        w = rng.uniform(-1, 1, (rows, cols)).astype(dtype)
        return w.view(np.uint8).reshape(rows, -1)
    if qtype == T.BF16:
        w = rng.uniform(-1, 1, (rows, cols)).astype(np.float32)
        return (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1)
    raw = rng.integers(0, 256, (rows, cols // values * size), dtype=np.uint8)
    blocks = raw.reshape(rows, -1, size)
    if qtype == getattr(T, "MXFP4", None):
        # Any byte is a block; E8M0 exponents of scales 2^-16 .. 2^-3 keep products finite
        # (test_mxfp4_rows_are_gguf_rows_for_every_byte takes every exponent).
        blocks[:, :, 0] = rng.integers(112, 126, blocks.shape[:2], dtype=np.uint8)
        return raw
    for at in HALVES.get(qtype, (0,)):
        h = rng.uniform(-0.02, 0.02, blocks.shape[:2]).astype(np.float16)
        blocks[:, :, at : at + 2] = h.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return raw


def columns(qtype: T) -> list[int]:
    """Odd and even column counts with whole blocks."""
    values = gguf.GGML_QUANT_SIZES[qtype][0]
    return {1: [1, 7, 77, 576], 32: [32, 96, 576], 256: [256, 768]}[values]


def gguf_weight(raw: np.ndarray, qtype: T, rows: int, cols: int) -> np.ndarray:
    return np.asarray(dequantize(raw, qtype), dtype=np.float32).reshape(rows, cols)


#: Bytes of a block holding its codes, for formats whose weights are ``scale * code - offset``:
#: with them zeroed, gguf dequantises a block to ``-offset``.
CODE_BYTES = {
    T.Q4_1: slice(4, 20),
    T.Q5_1: slice(4, 24),
    T.Q2_K: slice(16, 80),
    T.Q4_K: slice(16, 144),
    T.Q5_K: slice(16, 176),
}


def weight_offsets(raw: np.ndarray, qtype: T, rows: int, cols: int) -> np.ndarray:
    """``|offset|`` of every weight (zeros for symmetric formats)."""
    if qtype not in CODE_BYTES:
        return np.zeros((rows, cols), np.float32)
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    zeroed = raw.copy().reshape(rows, -1, size)
    zeroed[:, :, CODE_BYTES[qtype]] = 0
    return np.abs(gguf_weight(zeroed.reshape(rows, -1), qtype, rows, cols))


def assert_within_f32_accumulation(
    got: np.ndarray, x: np.ndarray, w: np.ndarray, off: np.ndarray, qtype: T
) -> None:
    """|got - x @ w.T| <= 2^-24 (c1 |x| @ (|w| + |off|).T + c2 |x| @ |off|.T): the float32
    bound of the kernels' sums (rust/quant/kernel.rs: a weight's scaling, k/8 multiply-adds a
    lane, the lanes' sum, the offset; float formats k/8 steps, the lanes and the tail). The
    AVX-512 build's sixteen-lane order for the 32-value-block formats (rust/quant/avx512.rs)
    rounds a value at most 2 + k/32 + 4 + 1 times, within c1 = k/8 + 5 for k >= 32."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    want = x64 @ w64.T
    k = w.shape[1]
    values = gguf.GGML_QUANT_SIZES[qtype][0]
    g = 16 if qtype in (T.Q2_K, T.Q3_K, T.Q6_K) else max(8, min(values, 32))
    c1 = k // 8 + 4 + k % 8 if values == 1 else k // 8 + 5
    c2 = c1 + g + k // g + 2
    ax, aoff = np.abs(x64), off.astype(np.float64)
    tol = 2.0**-24 * (c1 * (ax @ (np.abs(w64) + aoff).T) + c2 * (ax @ aoff.T)) + 1e-30
    err = np.abs(got.astype(np.float64) - want)
    assert (err <= tol).all(), f"worst error {err.max()} over bound {tol[err > tol].min()}"


@pytest.mark.parametrize("qtype", params(QTYPES))
def test_rows_are_gguf_dequantised_rows_exactly(qtype: T) -> None:
    for cols in columns(qtype):
        raw = random_blocks(qtype, 40, cols, seed=cols)
        want = gguf_weight(raw, qtype, 40, cols)
        ids = np.array([3, 0, 39, 3], dtype=np.int64)
        got = quant_rows(raw, int(qtype), cols, ids)
        np.testing.assert_array_equal(got.view(np.uint32), want[ids].view(np.uint32))


@pytest.mark.parametrize("qtype", params(QTYPES))
def test_matmul_is_x_times_the_dequantised_weight(qtype: T) -> None:
    # 700 rows x 1024 columns takes the threaded path as well.
    shapes = [(rows, cols) for cols in columns(qtype) for rows in (1, 13)]
    shapes.append((700, 1024))
    for rows, cols in shapes:
        raw = random_blocks(qtype, rows, cols, seed=rows + cols)
        w = gguf_weight(raw, qtype, rows, cols)
        off = weight_offsets(raw, qtype, rows, cols)
        for n in (1, 3, 8, 11):
            x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
            got = quant_matmul(raw, int(qtype), cols, x)
            assert got.shape == (n, rows)
            assert_within_f32_accumulation(got, x, w, off, qtype)


@pytest.mark.parametrize("qtype", params(QTYPES))
def test_every_batch_of_1_to_9_rows_is_exact_and_row_for_row_the_single_row_bits(
    qtype: T,
) -> None:
    # Two or more activation rows take the multi-row kernel (rust/quant/multirow.rs): weight
    # rows unpacked once for the batch, tiles of 3 weight rows x 2 activation rows. 7 and 13
    # weight rows leave partial tiles; each batch size leaves its own activation tail.
    values = gguf.GGML_QUANT_SIZES[qtype][0]
    for rows, cols in ((7, 3 * values if values > 1 else 111), (13, values if values > 1 else 77)):
        raw = random_blocks(qtype, rows, cols, seed=rows * cols)
        w = gguf_weight(raw, qtype, rows, cols)
        off = weight_offsets(raw, qtype, rows, cols)
        x = np.random.default_rng(rows).standard_normal((9, cols)).astype(np.float32)
        alone = np.stack([quant_matmul(raw, int(qtype), cols, x[t : t + 1])[0] for t in range(9)])
        for b in range(1, 10):
            got = quant_matmul(raw, int(qtype), cols, x[:b].copy())
            assert_within_f32_accumulation(got, x[:b], w, off, qtype)
            np.testing.assert_array_equal(got.view(np.uint32), alone[:b].view(np.uint32))


@settings(max_examples=40, deadline=None)
@given(
    qtype=st.sampled_from(QTYPES),
    rows=st.integers(1, 90),
    blocks=st.integers(1, 4),
    n=st.integers(1, 20),
    data=st.data(),
)
def test_one_row_is_bit_identical_whatever_the_batch_and_threads(
    qtype: T, rows: int, blocks: int, n: int, data: st.DataObject
) -> None:
    values = gguf.GGML_QUANT_SIZES[qtype][0]
    cols = blocks * (values if values > 1 else 37)
    raw = random_blocks(qtype, rows, cols, seed=rows * 7 + blocks)
    x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
    t = data.draw(st.integers(0, n - 1), label="row")
    threads_a = data.draw(st.integers(1, 3), label="threads of the batch")
    threads_b = data.draw(st.integers(1, 3), label="threads alone")
    batch = quant_matmul(raw, int(qtype), cols, x, threads=threads_a)
    alone = quant_matmul(raw, int(qtype), cols, x[t : t + 1].copy(), threads=threads_b)
    np.testing.assert_array_equal(alone[0].view(np.uint32), batch[t].view(np.uint32))
    # The same row elsewhere in another batch.
    other = np.concatenate([x[::-1], x[t : t + 1]])
    again = quant_matmul(raw, int(qtype), cols, other, threads=threads_a)
    np.testing.assert_array_equal(again[-1].view(np.uint32), batch[t].view(np.uint32))


needs_mxfp4 = pytest.mark.skipif(MXFP4_MISSING is not None, reason=MXFP4_MISSING or "")


def mxfp4_over_every_exponent(seed: int) -> np.ndarray:
    """256 MXFP4 rows of 64 values, row ``r``'s blocks of exponent ``r`` (any codes below
    e = 253; codes 0 and +-1 from there, so every weight is finite in float32)."""
    raw = np.random.default_rng(seed).integers(0, 256, (256, 2 * 17), dtype=np.uint8)
    blocks = raw.reshape(256, 2, 17)
    blocks[:, :, 0] = np.arange(256, dtype=np.uint8)[:, None]
    blocks[253:, :, 1:] &= 0x99  # nibbles 0, 1, 8, 9: codes 0, 1, 0, -1
    return raw


@needs_mxfp4
def test_mxfp4_rows_are_gguf_rows_for_every_byte() -> None:
    """Any 17 bytes are an MXFP4 block: every exponent (subnormal scales at e = 0, 1; weights
    past float32's range infinite, as gguf makes them) and every code, bit for bit."""
    raw = np.random.default_rng(3).integers(0, 256, (256, 3 * 17), dtype=np.uint8)
    raw.reshape(256, 3, 17)[:, 0, 0] = np.arange(256, dtype=np.uint8)
    with np.errstate(over="ignore"):  # gguf's own overflow to infinity
        want = gguf_weight(raw, T.MXFP4, 256, 96)
    assert np.isinf(want).any()
    assert (want[:2] != 0).any()
    got = quant_rows(raw, int(T.MXFP4), 96, np.arange(256, dtype=np.int64))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@needs_mxfp4
def test_mxfp4_over_every_exponent_is_x_times_the_dequantised_weight() -> None:
    """Rows of one exponent each, 0..255, with activations scaled so their products stay in
    float32's range (2^100 for e < 128, 2^-40 above): each row's result depends on its
    scale's decoding, and must be within the float32 bound, alone and in a batch."""
    raw = mxfp4_over_every_exponent(seed=4)
    for rows, scale in ((slice(0, 128), 2.0**100), (slice(128, 256), 2.0**-40)):
        part = np.ascontiguousarray(raw[rows])
        w = gguf_weight(part, T.MXFP4, 128, 64)
        assert np.isfinite(w).all()
        x = (np.random.default_rng(5).standard_normal((5, 64)) * scale).astype(np.float32)
        got = quant_matmul(part, int(T.MXFP4), 64, x)
        assert_within_f32_accumulation(got, x, w, np.zeros_like(w), T.MXFP4)
        one = quant_matmul(part, int(T.MXFP4), 64, x[2:3].copy())
        np.testing.assert_array_equal(one[0].view(np.uint32), got[2].view(np.uint32))


@needs_mxfp4
def test_inspect_reports_mxfp4_as_multiplied_in_place(tmp_path: Path) -> None:
    import rlx_lm

    path = tmp_path / "mx.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    raw = random_blocks(T.MXFP4, 4, 64)
    writer.add_tensor("blk.0.ffn_down_exps.weight", raw, raw_shape=raw.shape, raw_dtype=T.MXFP4)
    writer.add_tensor("output_norm.weight", np.ones(64, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    report = rlx_lm.inspect(path)
    assert report.dtypes.get("MXFP4") == 1, report.dtypes
    assert "dequantised at load" not in report.details, report.details


def test_quantised_by_gguf_round_trips_through_the_kernels() -> None:
    w = np.random.default_rng(1).standard_normal((16, 256)).astype(np.float32)
    mxfp4 = [] if MXFP4_MISSING else [T.MXFP4]
    for qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.BF16, T.F16, *mxfp4):
        raw = np.ascontiguousarray(quantize(w, qtype)).view(np.uint8)
        got = quant_rows(raw, int(qtype), 256, np.arange(16, dtype=np.int64))
        np.testing.assert_array_equal(got, gguf_weight(raw, qtype, 16, 256))


def cpu_flags() -> set[str]:
    """The x86 CPU's flags; none elsewhere. Under qemu-user (CI's aarch64 run) /proc/cpuinfo
    is the host's, not the emulated CPU's, so only an x86_64 process reads it."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def test_the_kernels_use_simd_where_the_cpu_has_it() -> None:
    assert quant_simd() in ("avx512", "avx2", "neon", "portable")
    flags = cpu_flags()
    wide = {"avx512f", "avx512bw", "avx512vl", "avx2", "fma", "f16c"}
    if "RLX_SIMD" not in os.environ and wide <= flags:
        assert quant_simd() == "avx512"
    if platform.machine() == "aarch64" and "RLX_SIMD" not in os.environ:
        assert quant_simd() == "neon"


def test_rlx_simd_avx2_runs_the_avx2_build_with_its_own_bits(tmp_path: Path) -> None:
    # The AVX-512 build has its own summation order for the 32-value-block formats (16 lanes,
    # rust/quant/avx512.rs) and runs the AVX2 kernels for every other format, so under
    # RLX_SIMD=avx2 those may differ in the last bits (each within the float32 bound) and
    # every other format gives the same bits.
    if not {"avx2", "fma", "f16c"} <= cpu_flags():
        pytest.skip("no AVX2 on this CPU")
    cases = {}
    for qtype in (T.Q4_0, T.Q5_0, T.Q4_1, T.Q8_0, T.Q6_K, T.F16):
        values = gguf.GGML_QUANT_SIZES[qtype][0]
        cols = 4 * values if values > 1 else 100
        raw = random_blocks(qtype, 29, cols, seed=cols)
        x = np.random.default_rng(cols).standard_normal((5, cols)).astype(np.float32)
        cases[qtype] = (raw, x)
        np.save(tmp_path / f"{qtype.name}_raw.npy", raw)
        np.save(tmp_path / f"{qtype.name}_x.npy", x)
    child = (
        "import sys, numpy as np\n"
        "from rlx_lm._core import quant_matmul, quant_simd\n"
        "d = sys.argv[1]\n"
        "assert quant_simd() == 'avx2', quant_simd()\n"
        "for name, ggml in (" + ", ".join(f"({t.name!r}, {int(t)})" for t in cases) + "):\n"
        "    raw, x = np.load(f'{d}/{name}_raw.npy'), np.load(f'{d}/{name}_x.npy')\n"
        "    out = [quant_matmul(raw, ggml, x.shape[1], x[t : t + 1])[0] for t in range(len(x))]\n"
        "    np.save(f'{d}/{name}_one.npy', np.stack(out))\n"
        "    np.save(f'{d}/{name}_all.npy', quant_matmul(raw, ggml, x.shape[1], x))\n"
    )
    env = {**os.environ, "RLX_SIMD": "avx2"}
    subprocess.run([sys.executable, "-c", child, str(tmp_path)], env=env, check=True)
    own_order = (T.Q4_0, T.Q5_0, T.Q4_1, T.Q8_0)
    for qtype, (raw, x) in cases.items():
        rows, cols = raw.shape[0], x.shape[1]
        one, batch = (np.load(tmp_path / f"{qtype.name}_{s}.npy") for s in ("one", "all"))
        np.testing.assert_array_equal(one.view(np.uint32), batch.view(np.uint32))
        assert_within_f32_accumulation(
            batch,
            x,
            gguf_weight(raw, qtype, rows, cols),
            weight_offsets(raw, qtype, rows, cols),
            qtype,
        )
        ours = quant_matmul(raw, int(qtype), cols, x)
        if quant_simd() == "avx512" and qtype in own_order:
            continue
        np.testing.assert_array_equal(ours.view(np.uint32), batch.view(np.uint32))


def test_bad_input_raises_typed_errors() -> None:
    raw = random_blocks(T.Q8_0, 4, 64)
    x = np.zeros((1, 64), np.float32)
    with pytest.raises(InvalidOptionError, match="ggml type 4"):
        quant_matmul(raw, 4, 64, x)
    with pytest.raises(ShapeError, match="whole number"):
        quant_matmul(raw, int(T.Q8_0), 60, np.zeros((1, 60), np.float32))
    with pytest.raises(ShapeError, match="whole number"):
        quant_matmul(raw, int(T.Q8_0), 0, np.zeros((1, 0), np.float32))
    with pytest.raises(ShapeError, match="columns"):
        quant_matmul(raw, int(T.Q8_0), 64, np.zeros((1, 32), np.float32))
    with pytest.raises(ShapeError, match="do not hold"):
        quant_matmul(np.ascontiguousarray(raw[:, :34]), int(T.Q8_0), 64, x)
    with pytest.raises(DtypeError, match="raw must be C-contiguous"):
        quant_matmul(raw[:, :34], int(T.Q8_0), 32, x[:, :32].copy())
    with pytest.raises(DtypeError, match="x must be C-contiguous"):
        quant_matmul(raw, int(T.Q8_0), 64, np.zeros((64, 2), np.float32).T[:1])
    with pytest.raises(ShapeError, match="2-D"):
        quant_matmul(raw, int(T.Q8_0), 64, np.zeros(64, np.float32))
    with pytest.raises(ShapeError, match="2-D"):
        quant_matmul(raw.ravel(), int(T.Q8_0), 64, x)
    with pytest.raises(DtypeError, match="float32"):
        quant_matmul(raw, int(T.Q8_0), 64, x.astype(np.float64))
    with pytest.raises(DtypeError, match="uint8"):
        quant_matmul(raw.astype(np.int16), int(T.Q8_0), 64, x)
    with pytest.raises(DtypeError, match="numpy"):
        quant_matmul(raw, int(T.Q8_0), 64, [[0.0] * 64])
    # Huge column counts are refused before anything is allocated (this aborted once).
    with pytest.raises(ShapeError):
        quant_rows(raw, int(T.Q8_0), 2**40, np.array([0], dtype=np.int64))
    with pytest.raises(ShapeError):
        quant_matmul(raw, int(T.Q8_0), 2**62, x)
    with pytest.raises(TokenOutOfRangeError):
        quant_rows(raw, int(T.Q8_0), 64, np.array([4], dtype=np.int64))
    with pytest.raises(TokenOutOfRangeError):
        quant_rows(raw, int(T.Q8_0), 64, np.array([-1], dtype=np.int64))
    with pytest.raises(DtypeError, match="int64"):
        quant_rows(raw, int(T.Q8_0), 64, np.array([0], dtype=np.int32))
    with pytest.raises(ShapeError, match="1-D"):
        quant_rows(raw, int(T.Q8_0), 64, np.array([[0]], dtype=np.int64))


def test_inputs_are_released_after_the_call() -> None:
    # While a call runs the inputs are pinned (numpy refuses to resize them); afterwards
    # nothing holds them.
    raw = random_blocks(T.Q8_0, 4, 64)
    x = np.zeros((1, 64), np.float32)
    quant_matmul(raw, int(T.Q8_0), 64, x)
    x.resize((2, 64), refcheck=True)
    raw.resize((2, 68), refcheck=True)


def test_empty_batches_and_ids_give_empty_results() -> None:
    raw = random_blocks(T.Q4_K, 3, 256)
    assert quant_matmul(raw, int(T.Q4_K), 256, np.zeros((0, 256), np.float32)).shape == (0, 3)
    assert quant_rows(raw, int(T.Q4_K), 256, np.zeros(0, np.int64)).shape == (0, 256)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_packed_matrix_uses_the_kernels_and_agrees_with_its_gguf_fallback(qtype: T) -> None:
    raw = random_blocks(qtype, 32, 256, seed=5)
    native = PackedMatrix(raw, qtype, (32, 256))
    fallback = PackedMatrix(raw, qtype, (32, 256))
    fallback.native = False
    assert native.native
    x = np.random.default_rng(2).standard_normal((3, 256)).astype(np.float32)
    np.testing.assert_allclose(native.apply(x), fallback.apply(x), rtol=1e-5, atol=1e-5)
    ids = np.array([1, 31], dtype=np.intp)
    np.testing.assert_array_equal(native.rows(ids), fallback.rows(ids))


def test_the_cores_quant_type_table_is_ggmls() -> None:
    """Quant ids and block geometry are defined once, in the core (rust/quant/format.rs),
    and exported; they must be the gguf package's (llama.cpp's) numbers."""
    from rlx_lm._core import QUANT_TYPES, engine_kernel_types
    from rlx_lm._headers import GGML_TYPES

    assert QUANT_TYPES, "the core exports its formats"
    known = {int(t) for t in T}
    for name, (ggml_id, values, size) in QUANT_TYPES.items():
        assert GGML_TYPES[ggml_id] == (name, values, size), name
        if ggml_id not in known:
            continue  # newer than this gguf (MXFP4 before gguf-py learnt it)
        qt = T(ggml_id)
        assert qt.name == name
        assert gguf.GGML_QUANT_SIZES[qt] == (values, size), name
    assert sorted(engine_kernel_types()) == sorted(i for i, _, _ in QUANT_TYPES.values())
