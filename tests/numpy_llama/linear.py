"""Weight matrices of linear layers: dense float32, or GGUF blocks used in place."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["DenseMatrix", "Matrix", "PackedMatrix"]

F32 = npt.NDArray[np.float32]


class Matrix(Protocol):
    """A ``[out, in]`` weight: ``x @ W.T`` for activations ``x`` of shape ``[n, in]``."""

    shape: tuple[int, int]

    def apply(self, x: F32) -> F32:
        """Return ``x @ W.T`` as float32 ``[n, out]``."""
        ...

    def rows(self, ids: npt.NDArray[np.intp]) -> F32:
        """Return the float32 rows ``W[ids]`` (embedding lookup)."""
        ...

    @property
    def nbytes(self) -> int:
        """Resident bytes of the stored weight."""
        ...


class DenseMatrix:
    """A float32 matrix held in memory; matmuls go straight to numpy's BLAS."""

    def __init__(self, w: F32) -> None:
        if w.ndim != 2:
            raise ValueError(f"a weight matrix must be 2-D, got shape {w.shape}")
        self.w = np.ascontiguousarray(w, dtype=np.float32)
        self.shape = (int(w.shape[0]), int(w.shape[1]))

    def apply(self, x: F32) -> F32:
        """Return ``x @ W.T``."""
        out: F32 = x @ self.w.T
        return out

    def rows(self, ids: npt.NDArray[np.intp]) -> F32:
        """Return ``W[ids]``."""
        return self.w[ids]

    @property
    def nbytes(self) -> int:
        """Resident bytes of the matrix."""
        return int(self.w.nbytes)


#: ggml type ids the Rust kernels multiply in place (Q4_0, Q8_0, Q4_K, Q6_K).
NATIVE_QUANTS = frozenset({2, 8, 12, 14})


class PackedMatrix:
    """A GGUF-quantised matrix kept as its raw blocks; resident memory is the quantised size.

    Q4_0, Q8_0, Q4_K and Q6_K multiply in Rust, a row dequantised at a time into a small
    buffer and the GIL released; other formats are dequantised with ``gguf`` in slabs of
    ``slab_rows`` rows per use.
    """

    def __init__(
        self,
        raw: npt.NDArray[np.uint8],
        qtype: Any,
        shape: tuple[int, int],
        *,
        slab_rows: int = 1024,
    ) -> None:
        from gguf.quants import dequantize

        self._dequantize = dequantize
        if raw.ndim != 2 or raw.shape[0] != shape[0]:
            raise ValueError(f"packed data of shape {raw.shape} does not hold {shape[0]} rows")
        self.raw = np.ascontiguousarray(raw)
        self.qtype = qtype
        self.shape = shape
        self.slab_rows = max(1, slab_rows)
        self.native = int(qtype) in NATIVE_QUANTS

    def _slab(self, lo: int, hi: int) -> F32:
        out = self._dequantize(np.asarray(self.raw[lo:hi]), self.qtype)
        return np.asarray(out, dtype=np.float32).reshape(hi - lo, self.shape[1])

    def apply(self, x: F32) -> F32:
        """Return ``x @ W.T``."""
        if self.native:
            from rlx_lm._core import quant_matmul

            xs = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, self.shape[1])
            out: F32 = quant_matmul(self.raw, int(self.qtype), self.shape[1], xs)
            return out.reshape(*x.shape[:-1], self.shape[0])
        res = np.empty((x.shape[0], self.shape[0]), dtype=np.float32)
        for lo in range(0, self.shape[0], self.slab_rows):
            hi = min(lo + self.slab_rows, self.shape[0])
            np.matmul(x, self._slab(lo, hi).T, out=res[:, lo:hi])
        return res

    def rows(self, ids: npt.NDArray[np.intp]) -> F32:
        """Return ``W[ids]``, dequantising only those rows."""
        if self.native:
            from rlx_lm._core import quant_rows

            picked: F32 = quant_rows(
                self.raw, int(self.qtype), self.shape[1], np.asarray(ids, dtype=np.int64).ravel()
            )
            return picked
        raw = np.asarray(self.raw[np.asarray(ids, dtype=np.intp)])
        out = self._dequantize(raw, self.qtype)
        return np.asarray(out, dtype=np.float32).reshape(len(ids), self.shape[1])

    @property
    def nbytes(self) -> int:
        """Resident bytes of the quantised blocks."""
        return int(self.raw.nbytes)
