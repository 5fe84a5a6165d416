"""The fast mode's kernels (``quant_matmul(..., activations="q8")``) against numpy.

The reference quantises the activations exactly as ggml's ``quantize_row_q8_0_ref`` (blocks of
32, for Q4_0/Q4_1/Q5_x/Q8_0/IQ4_NL/MXFP4 weights) and ``quantize_row_q8_K_ref`` (blocks of 256, for
the K-quants and IQ4_XS) do, keeping the block scales in float32, then multiplies the
dequantised activations by gguf's dequantised weights in float64. The integer kernels must
agree to float32 rounding on random blocks and odd shapes, and give a row the same bits
whatever the batch or the threads.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_quant import (
    QTYPES,
    assert_within_f32_accumulation,
    columns,
    gguf_weight,
    mxfp4_over_every_exponent,
    needs_mxfp4,
    params,
    random_blocks,
    weight_offsets,
)

from rlx_lm._core import quant_matmul
from rlx_lm.errors import InvalidOptionError

T = gguf.GGMLQuantizationType
FLOATS = (T.F32, T.F16, T.BF16)
BLOCK_TYPES = [t for t in QTYPES if t not in FLOATS]
K_BLOCKS = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS)


def act_block(qtype: T) -> int:
    return 256 if qtype in K_BLOCKS else 32


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """ggml's Q8_0 rounding of float32 rows (scale kept float32), dequantised."""
    b = x.astype(np.float32).reshape(-1, 32)
    d = (np.abs(b).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (b * inv).astype(np.float32)
    q = np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))  # roundf: halves away from zero
    return (d.astype(np.float64) * q).reshape(x.shape)


def quantize_q8_k(x: np.ndarray) -> np.ndarray:
    """ggml's Q8_K rounding of float32 rows, dequantised."""
    b = x.astype(np.float32).reshape(-1, 256)
    at = np.abs(b).argmax(axis=1)
    m = b[np.arange(len(b)), at][:, None]
    out = np.zeros(b.shape, np.float64)
    nz = (m != 0)[:, 0]
    iscale = (np.float32(-127) / m[nz]).astype(np.float32)
    q = np.minimum(np.round((iscale * b[nz]).astype(np.float32)), 127)  # halves to even
    out[nz] = (np.float32(1) / iscale).astype(np.float64) * q
    return out.reshape(x.shape)


def dequantised_activations(x: np.ndarray, qtype: T) -> np.ndarray:
    return quantize_q8_k(x) if act_block(qtype) == 256 else quantize_q8_0(x)


@pytest.mark.parametrize("qtype", params(BLOCK_TYPES))
def test_q8_matmul_is_the_quantised_activations_times_the_dequantised_weight(qtype: T) -> None:
    shapes = [(rows, cols) for cols in columns(qtype) for rows in (1, 13)]
    shapes.append((700, 1024))  # the threaded path
    for rows, cols in shapes:
        raw = random_blocks(qtype, rows, cols, seed=rows + cols)
        w = gguf_weight(raw, qtype, rows, cols)
        off = weight_offsets(raw, qtype, rows, cols)
        for n in (1, 3, 8, 11):
            x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
            x[0, :7] = 0.0  # zeros and a large value in the first block
            x[-1, 3] = 40.0
            got = quant_matmul(raw, int(qtype), cols, x, activations="q8")
            assert got.shape == (n, rows)
            xq = dequantised_activations(x, qtype)
            assert_within_f32_accumulation(got, xq, w, off, qtype)


@needs_mxfp4
def test_q8_mxfp4_over_every_exponent_is_the_quantised_activations_times_the_weight() -> None:
    """llama.cpp's ``vec_dot_mxfp4_q8_0`` (an int dot of codes and int8 activations a block,
    times ``d_w * d_a``) for rows of every exponent 0..255 (subnormal scales at e = 0, 1),
    activations scaled to keep the products in float32's range, alone and in a batch."""
    raw = mxfp4_over_every_exponent(seed=6)
    for rows, scale in ((slice(0, 128), 2.0**100), (slice(128, 256), 2.0**-40)):
        part = np.ascontiguousarray(raw[rows])
        w = gguf_weight(part, T.MXFP4, 128, 64)
        x = (np.random.default_rng(7).standard_normal((5, 64)) * scale).astype(np.float32)
        got = quant_matmul(part, int(T.MXFP4), 64, x, activations="q8")
        xq = dequantised_activations(x, T.MXFP4)
        assert_within_f32_accumulation(got, xq, w, np.zeros_like(w), T.MXFP4)
        one = quant_matmul(part, int(T.MXFP4), 64, x[4:5].copy(), activations="q8")
        np.testing.assert_array_equal(one[0].view(np.uint32), got[4].view(np.uint32))


def test_an_all_zero_block_quantises_to_zero() -> None:
    raw = random_blocks(T.Q8_0, 5, 64)
    x = np.zeros((2, 64), np.float32)
    x[1, 32:] = 1.0
    got = quant_matmul(raw, int(T.Q8_0), 64, x, activations="q8")
    np.testing.assert_array_equal(got[0], np.zeros(5, np.float32))
    want = gguf_weight(raw, T.Q8_0, 5, 64)[:, 32:].astype(np.float64).sum(axis=1)
    np.testing.assert_allclose(got[1], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("qtype", FLOATS, ids=lambda t: t.name)
def test_float_weights_stay_exact(qtype: T) -> None:
    raw = random_blocks(qtype, 9, 77)
    x = np.random.default_rng(0).standard_normal((3, 77)).astype(np.float32)
    fast = quant_matmul(raw, int(qtype), 77, x, activations="q8")
    np.testing.assert_array_equal(fast, quant_matmul(raw, int(qtype), 77, x))


def test_q8_is_close_to_the_exact_product() -> None:
    # What the mode costs on one product: about 1% of the magnitude of the terms.
    raw = random_blocks(T.Q4_0, 64, 576)
    x = np.random.default_rng(2).standard_normal((4, 576)).astype(np.float32)
    w = gguf_weight(raw, T.Q4_0, 64, 576).astype(np.float64)
    exact = x.astype(np.float64) @ w.T
    fast = quant_matmul(raw, int(T.Q4_0), 576, x, activations="q8")
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T
    assert float(np.abs(fast - exact).max() / scale.max()) < 1e-2
    assert not np.array_equal(fast, quant_matmul(raw, int(T.Q4_0), 576, x))


@settings(max_examples=30, deadline=None)
@given(
    qtype=st.sampled_from(BLOCK_TYPES),
    rows=st.integers(1, 90),
    blocks=st.integers(1, 3),
    n=st.integers(1, 12),
    data=st.data(),
)
def test_q8_rows_are_bit_identical_whatever_the_batch_and_threads(
    qtype: T, rows: int, blocks: int, n: int, data: st.DataObject
) -> None:
    cols = blocks * gguf.GGML_QUANT_SIZES[qtype][0]
    raw = random_blocks(qtype, rows, cols, seed=rows * 5 + blocks)
    x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
    t = data.draw(st.integers(0, n - 1), label="row")
    ta = data.draw(st.integers(1, 3), label="threads of the batch")
    tb = data.draw(st.integers(1, 3), label="threads alone")
    batch = quant_matmul(raw, int(qtype), cols, x, threads=ta, activations="q8")
    alone = quant_matmul(raw, int(qtype), cols, x[t : t + 1].copy(), threads=tb, activations="q8")
    np.testing.assert_array_equal(alone[0].view(np.uint32), batch[t].view(np.uint32))


@pytest.mark.parametrize("qtype", params(BLOCK_TYPES))
def test_every_batch_of_1_to_9_rows_gives_each_row_its_single_row_bits(qtype: T) -> None:
    """Every kernel this CPU runs (one row, two rows, the multi-row tiles; on AVX-512 VNNI
    machines the ``vpdpbusd`` ones) gives a row the bits it has alone, whole and partial tiles
    of weight rows."""
    cols = max(columns(qtype))
    raw = random_blocks(qtype, 13, cols, seed=int(qtype))
    x = np.random.default_rng(int(qtype)).standard_normal((9, cols)).astype(np.float32)
    alone = np.stack(
        [
            quant_matmul(raw, int(qtype), cols, x[t : t + 1].copy(), activations="q8")[0]
            for t in range(9)
        ]
    )
    for n in range(1, 10):
        for t0 in {0, 9 - n}:
            batch = quant_matmul(raw, int(qtype), cols, x[t0 : t0 + n].copy(), activations="q8")
            np.testing.assert_array_equal(
                batch.view(np.uint32),
                alone[t0 : t0 + n].view(np.uint32),
                err_msg=f"n={n} from {t0}",
            )


def test_an_unknown_mode_is_refused() -> None:
    raw = random_blocks(T.Q8_0, 4, 64)
    with pytest.raises(InvalidOptionError, match="activations"):
        quant_matmul(raw, int(T.Q8_0), 64, np.zeros((1, 64), np.float32), activations="q4")
