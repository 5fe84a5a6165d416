"""GGUF block-quantised weights used in place: Rust kernels against gguf's own dequantiser."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize, quantize
from numpy_llama.linear import PackedMatrix

from rlx_lm._core import quant_matmul, quant_rows
from rlx_lm.errors import InvalidOptionError, ShapeError, TokenOutOfRangeError

T = gguf.GGMLQuantizationType
QTYPES = [T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K]


def random_blocks(qtype: T, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random block bytes with small, finite float16 scales (every other byte is arbitrary)."""
    rng = np.random.default_rng(seed)
    values, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // values * size), dtype=np.uint8)
    blocks = raw.reshape(rows, -1, size)

    def halves(lo: float, hi: float) -> np.ndarray:
        h = rng.uniform(lo, hi, blocks.shape[:2]).astype(np.float16)
        return h.view(np.uint8).reshape(*blocks.shape[:2], 2)

    at = 208 if qtype == T.Q6_K else 0
    blocks[:, :, at : at + 2] = halves(-0.02, 0.02)
    if qtype == T.Q4_K:
        blocks[:, :, 2:4] = halves(0.0, 0.02)  # dmin
    return raw


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
def test_rows_are_gguf_dequantised_rows_exactly(qtype: T) -> None:
    raw = random_blocks(qtype, 40, 512)
    want = dequantize(raw, qtype).reshape(40, 512)
    ids = np.array([3, 0, 39, 3], dtype=np.int64)
    np.testing.assert_array_equal(quant_rows(raw, int(qtype), 512, ids), want[ids])


@pytest.mark.parametrize("n", [1, 5])
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
def test_matmul_is_x_times_the_dequantised_weight(qtype: T, n: int) -> None:
    # 700 rows x 1024 columns takes the threaded path as well (over 2^18 weights).
    for rows, cols in [(24, 256), (700, 1024)]:
        raw = random_blocks(qtype, rows, cols, seed=rows)
        w = dequantize(raw, qtype).reshape(rows, cols).astype(np.float64)
        x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
        got = quant_matmul(raw, int(qtype), cols, x)
        want = x.astype(np.float64) @ w.T
        assert got.shape == (n, rows)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_quantised_by_gguf_round_trips_through_the_kernels() -> None:
    w = np.random.default_rng(1).standard_normal((16, 256)).astype(np.float32)
    for qtype in (T.Q4_0, T.Q8_0):
        raw = quantize(w, qtype)
        got = quant_rows(raw, int(qtype), 256, np.arange(16, dtype=np.int64))
        np.testing.assert_array_equal(got, dequantize(raw, qtype).reshape(16, 256))


def test_bad_input_raises_typed_errors() -> None:
    raw = random_blocks(T.Q8_0, 4, 64)
    x = np.zeros((1, 64), np.float32)
    with pytest.raises(InvalidOptionError, match="ggml type 3"):
        quant_matmul(raw, 3, 64, x)
    with pytest.raises(ShapeError, match="whole number"):
        quant_matmul(raw, int(T.Q8_0), 60, np.zeros((1, 60), np.float32))
    with pytest.raises(ShapeError, match="columns"):
        quant_matmul(raw, int(T.Q8_0), 64, np.zeros((1, 32), np.float32))
    with pytest.raises(ShapeError, match="do not hold"):
        quant_matmul(np.ascontiguousarray(raw[:, :34]), int(T.Q8_0), 64, x)
    with pytest.raises(ShapeError, match="raw must be C-contiguous"):
        quant_matmul(raw[:, :34], int(T.Q8_0), 32, x[:, :32].copy())
    with pytest.raises(ShapeError, match="x must be C-contiguous"):
        quant_matmul(raw, int(T.Q8_0), 64, np.zeros((64, 2), np.float32).T[:1])
    with pytest.raises(TokenOutOfRangeError):
        quant_rows(raw, int(T.Q8_0), 64, np.array([4], dtype=np.int64))
    with pytest.raises(TokenOutOfRangeError):
        quant_rows(raw, int(T.Q8_0), 64, np.array([-1], dtype=np.int64))
    with pytest.raises(TypeError):
        quant_matmul(raw, int(T.Q8_0), 64, x.astype(np.float64))  # type: ignore[arg-type]


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
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
