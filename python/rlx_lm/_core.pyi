"""Types of the compiled module `rlx_lm._core`; import public names from `rlx_lm`."""

from os import PathLike
from typing import Any, Final, final

import numpy as np
import numpy.typing as npt

__version__: Final[str]
build_profile: Final[str]

def argmax(logits: npt.NDArray[np.float32], /) -> int:
    """Index of the largest logit in a float32 row (lowest index on ties)."""

# --- KV cache (rust/py/kv.rs) -------------------------------------------------

@final
class KvCache:
    """Per-layer key/value cache for attention, with cheap snapshots."""

    def __init__(
        self,
        *,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        max_seq: int,
        dtype: str | np.dtype[Any] | type | None = None,
    ) -> None: ...
    def append(
        self,
        layer: int,
        k: npt.NDArray[np.float32],
        v: npt.NDArray[np.float32],
    ) -> None:
        """Append rows `k`, `v` (float32 `[n_kv_heads, n_new, head_dim]`) to one layer."""
    def keys(self, layer: int) -> npt.NDArray[Any]:
        """The keys of one layer as a read-only view `[n_kv_heads, len, head_dim]`."""
    def values(self, layer: int) -> npt.NDArray[Any]:
        """The values of one layer as a read-only view `[n_kv_heads, len, head_dim]`."""
    def truncate(self, n: int) -> None:
        """Keep the first `n` tokens (at most `len()`)."""
    def clear(self) -> None:
        """Drop every token."""
    def snapshot(self) -> KvSnapshot:
        """Freeze the current contents; costs one reference per layer, copies nothing."""
    def restore(self, snapshot: KvSnapshot) -> None:
        """Replace the contents with a snapshot's; copies nothing."""
    def len(self) -> int:
        """Tokens every layer holds."""
    def layer_len(self, layer: int) -> int:
        """Tokens held by one layer (differs from `len()` only mid forward pass)."""
    @property
    def nbytes(self) -> int:
        """Bytes of the stored rows (keys and values, all layers)."""
    @property
    def n_layers(self) -> int:
        """Number of layers."""
    @property
    def n_kv_heads(self) -> int:
        """Key/value heads per layer."""
    @property
    def head_dim(self) -> int:
        """Elements per head."""
    @property
    def max_seq(self) -> int:
        """Tokens each layer can hold."""
    @property
    def dtype(self) -> str:
        """Storage dtype name, "float32" or "float16"."""

@final
class KvSnapshot:
    """An immutable copy-on-write snapshot of a KvCache."""

    def len(self) -> int:
        """Tokens held."""
    def keys(self, layer: int) -> npt.NDArray[Any]:
        """The keys of one layer as a read-only view `[n_kv_heads, len, head_dim]`."""
    def values(self, layer: int) -> npt.NDArray[Any]:
        """The values of one layer as a read-only view `[n_kv_heads, len, head_dim]`."""
    def storage(self) -> list[tuple[int, int, int]]:
        """Shared storage pinned, as `(storage_id, blocks, block_bytes)` per layer."""
    @property
    def nbytes(self) -> int:
        """Bytes of the rows held (keys and values, all layers)."""
    @property
    def n_layers(self) -> int:
        """Number of layers."""
    @property
    def n_kv_heads(self) -> int:
        """Key/value heads per layer."""
    @property
    def head_dim(self) -> int:
        """Elements per head."""
    @property
    def max_seq(self) -> int:
        """Capacity of the cache the snapshot was taken from."""
    @property
    def dtype(self) -> str:
        """Storage dtype name, "float32" or "float16"."""
    def _write_data(self, path: str | PathLike[str]) -> None: ...
    @staticmethod
    def _read_data(
        path: str | PathLike[str],
        offset: int,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        dtype: str,
        max_seq: int,
        len: int,
    ) -> KvSnapshot: ...
    def __reduce__(self) -> tuple[Any, ...]: ...

def _kv_snapshot_from_state(state: bytes, /) -> KvSnapshot: ...
