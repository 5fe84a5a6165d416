"""Types of the compiled module `rlx_lm._core`; import public names from `rlx_lm`."""

from collections.abc import Sequence
from typing import Any, Final, Literal, final

import numpy as np
import numpy.typing as npt
from typing_extensions import Self

__all__ = [
    "KV_BLOCK_TOKENS",
    "KV_MAX_HEAD_DIM",
    "KV_MAX_KV_HEADS",
    "KV_MAX_LAYERS",
    "KV_MAX_SEQ",
    "QUANT_TYPES",
    "SAMPLER_KNOBS",
    "SAMPLER_PRESETS",
    "SAMPLER_STAGES",
    "Engine",
    "KvCache",
    "KvSnapshot",
    "SampleResult",
    "SamplerChain",
    "__version__",
    "_kv_snapshot_from_state",
    "_panic_for_tests",
    "_sampler_chain_from_state",
    "_validate_sample_opts",
    "argmax",
    "build_profile",
    "engine_kernel_types",
    "gguf_strings",
    "quant_matmul",
    "quant_rows",
    "quant_simd",
    "spm_merges",
]

__version__: Final[str]
build_profile: Final[str]
KV_BLOCK_TOKENS: Final[int]
"""Token granularity of KV storage accounting."""
KV_MAX_SEQ: Final[int]
"""Largest capacity a KV cache (and a snapshot read from a file) may have."""
KV_MAX_LAYERS: Final[int]
"""Most layers a KV cache may have."""
KV_MAX_KV_HEADS: Final[int]
"""Most key/value heads per layer."""
KV_MAX_HEAD_DIM: Final[int]
"""Most elements per head."""
QUANT_TYPES: Final[dict[str, tuple[int, int, int]]]
"""Weight formats the core reads: ggml name -> (ggml type id, values per block, bytes per
block), defined once in ``rust/quant/format.rs``."""

def argmax(logits: npt.NDArray[np.float32]) -> int:
    """Index of the largest logit in a float32 row (lowest index on ties)."""

def _panic_for_tests(message: str) -> None:
    """Panics on purpose inside the binding's panic boundary (raises InternalError)."""

def gguf_strings(
    chunk: bytes, count: int, big_endian: bool, keep: bool
) -> tuple[int, int, list[str], int | None]:
    """Up to ``count`` GGUF strings whole in ``chunk``: ``(parsed, consumed bytes, texts
    (when ``keep``), index of the first non-UTF-8 one)`` (rust/gguf_strings.rs)."""

def spm_merges(
    tokens: list[str], mergeable: list[bool], scores: list[float]
) -> list[tuple[int, int]]:
    """The BPE merges of a SentencePiece vocabulary as ``(left id, right id)``, best first:
    every split of a mergeable piece into two pieces, ranked by the piece's score, then the
    left and right ids (rust/spm_merges.rs)."""

# --- GGUF block-quantised weights (rust/py/quant.rs) ------------------------

def quant_matmul(
    raw: npt.NDArray[np.uint8],
    qtype: int,
    cols: int,
    x: npt.NDArray[np.float32],
    *,
    threads: int | None = None,
    activations: str = "exact",
) -> npt.NDArray[np.float32]:
    """``x @ W.T`` for ``W`` stored as GGUF blocks (``raw`` is ``[rows, row_bytes]``).

    F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, IQ4_NL, IQ4_XS and MXFP4;
    ``threads`` runs it on a pool of that many threads (1: on the calling thread;
    default: the process's shared pool). ``activations="q8"`` quantises ``x`` to 8 bits first
    (Q8_0 blocks of 32, Q8_K blocks of 256 for the K-quants and IQ4_XS) and uses integer
    dot products; float formats stay exact."""

def quant_rows(
    raw: npt.NDArray[np.uint8], qtype: int, cols: int, ids: npt.NDArray[np.int64]
) -> npt.NDArray[np.float32]:
    """The dequantised rows ``ids`` of a GGUF block-quantised ``W``."""

def quant_simd() -> str:
    """The kernel build this process runs: ``"avx512"``, ``"avx2"``, ``"neon"`` or ``"portable"``
    (the widest the CPU has, or a narrower one named by ``RLX_SIMD``)."""

# --- sampler chain (rust/py/sampling.rs) ------------------------------------

_History = Sequence[int] | npt.NDArray[np.integer[Any]] | None

@final
class SampleResult:
    """A sampled token with its log-probability and the most likely alternatives."""

    @property
    def token(self) -> int:
        """The sampled token id."""
    @property
    def logprob(self) -> float:
        """Its natural-log probability under the chosen distribution."""
    @property
    def top(self) -> list[tuple[int, float]]:
        """The `top_n` most likely tokens as (token, logprob), best first."""
    @property
    def mode(self) -> Literal["raw", "penalized", "final"]:
        """Which distribution the log-probabilities describe."""

@final
class SamplerChain:
    """A sampler chain built from `SampleOpts`: stages, order and per-sequence state."""

    def __new__(
        cls, opts: Any, order: str | Sequence[str] | None = None, sequence_id: int = 0
    ) -> Self: ...
    def sample(
        self,
        logits: npt.NDArray[np.float32],
        history: _History = None,
        *,
        prompt_len: int = 0,
        uniform: float | None = None,
        advance: bool = True,
    ) -> int:
        """Sample one token and accept it (the step and mu move on) unless ``advance=False``."""
    def peek(
        self,
        logits: npt.NDArray[np.float32],
        history: _History = None,
        *,
        prompt_len: int = 0,
        uniform: float | None = None,
    ) -> int:
        """The token `sample` would return, without moving the chain on."""
    def sample_with_logprobs(
        self,
        logits: npt.NDArray[np.float32],
        history: _History = None,
        top_n: int = 0,
        *,
        mode: Literal["raw", "penalized", "final"] = "raw",
        prompt_len: int = 0,
        uniform: float | None = None,
        advance: bool = True,
    ) -> SampleResult:
        """Sample one token and report log-probabilities under `mode`'s distribution."""
    def sample_batch(
        self,
        logits: npt.NDArray[np.float32],
        histories: Sequence[_History] | None = None,
        *,
        prompt_lens: Sequence[int] | None = None,
        sequence_ids: Sequence[int] | None = None,
        uniforms: Sequence[float] | None = None,
        advance: bool = True,
    ) -> npt.NDArray[np.int64]:
        """Sample every row of a 2-D float32 array (rows in parallel, GIL released), then step on.

        The rows are sampled with the chain as it is when the call starts; the
        logits array is pinned (numpy refuses to resize it) until it returns.
        """
    def accept(self, token: int) -> None:
        """Record the emitted token after `peek`: advances the step and mirostat's mu."""
    def reset(self) -> None:
        """Return to step 0 and the initial mirostat mu (same seed, same tokens)."""
    def clone(self) -> Self:
        """An independent copy with the same knobs, seed and state."""
    def __copy__(self) -> Self: ...
    def __deepcopy__(self, memo: dict[int, Any], /) -> Self: ...
    def __reduce__(self) -> tuple[Any, ...]: ...
    @property
    def step(self) -> int:
        """Tokens accepted since construction or the last reset."""
    @property
    def seed(self) -> int:
        """The seed of the draw (chosen at random when the options had none)."""
    @property
    def sequence_id(self) -> int:
        """The sequence id keyed into the draw."""
    @property
    def mu(self) -> float | None:
        """Mirostat's current mu, or None without mirostat."""
    @property
    def stages(self) -> list[str]:
        """The stages that run, in order, ending with the selector."""
    @property
    def order(self) -> str:
        """The order's name: "default", a preset, or "custom"."""
    @property
    def is_greedy(self) -> bool:
        """Whether the chain is a plain argmax (no RNG)."""

def _sampler_chain_from_state(state: bytes) -> SamplerChain: ...
def _validate_sample_opts(opts: object) -> None:
    """Check options as a chain would (every knob through the core's table), building none."""

SAMPLER_KNOBS: Final[tuple[dict[str, Any], ...]]
"""Every knob, in ``SampleOpts``' field order: ``name``, ``kind``, ``default``, ``lo`` and
``hi`` (``(bound, inclusive)`` or None), ``expect``, ``help``, ``flag`` (llama.cpp's, or
None), ``probe`` (the ``(lo, hi)`` tests and fuzzers draw from), ``server_fields`` (its
names in a server request body); described once in
``rust/sampling/knobs.rs``."""
SAMPLER_STAGES: Final[tuple[dict[str, Any], ...]]
"""Every stage in the default order: ``name``, ``knobs``, ``edits``, ``llama_cpp_names`` (its
names in llama.cpp's ``--samplers``), ``llama_cpp_letter`` (its letter in llama-server's
``samplers`` string, or None), ``min_keep`` (``"never"``, ``"always"`` or
``"flavor"``); described once in ``rust/sampling/stages.rs``."""
SAMPLER_PRESETS: Final[dict[str, tuple[str, ...]]]
"""Each order preset's stage names, in order (from each stage's place in
``rust/sampling/stages.rs``)."""

# --- KV cache (rust/py/kv.rs) -------------------------------------------------

@final
class KvCache:
    """Per-layer key/value cache for attention, with cheap snapshots."""

    def __new__(
        cls,
        *,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        max_seq: int,
        dtype: str | np.dtype[Any] | type | None = None,
    ) -> Self: ...
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
    def __len__(self) -> int:
        """``len(cache)``: tokens every layer holds."""
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
    def __len__(self) -> int:
        """``len(snapshot)``: tokens held."""
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
    def prefix(self, n: int) -> KvSnapshot:
        """The first `n` tokens, sharing these rows (no copy)."""
    def _write_data(self, fd: int, offset: int) -> None: ...
    @staticmethod
    def _read_data(
        fd: int,
        offset: int,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        dtype: str,
        max_seq: int,
        len: int,
    ) -> KvSnapshot: ...
    def __copy__(self) -> KvSnapshot: ...
    def __deepcopy__(self, memo: Any, /) -> KvSnapshot: ...
    def __reduce__(self) -> tuple[Any, ...]: ...

def _kv_snapshot_from_state(state: bytes) -> KvSnapshot: ...
def engine_kernel_types() -> list[int]:
    """ggml type ids the engine multiplies in place."""
    ...

@final
class Engine:
    """A model run in place on its stored weights, with a thread pool of its own."""

    def __new__(
        cls,
        *,
        config: dict[str, Any],
        files: list[str],
        tensors: list[tuple[str, int, int, int, list[int]]],
        owned: list[tuple[str, list[int], npt.NDArray[np.float32]]],
        threads: int,
        activations: str = "exact",
        use_mmap: bool | None = None,
    ) -> Self: ...
    def forward(
        self, cache: KvCache, ids: npt.NDArray[np.int64], all_logits: bool = False
    ) -> npt.NDArray[np.float32]:
        """Feed ``ids`` to ``cache``; the last token's logits (every token's with all_logits)."""
        ...
    def decode(self, cache: KvCache, token: int) -> npt.NDArray[np.float32]:
        """Append ``token`` to ``cache``; the next position's logits."""
        ...
    def decode_batch(self, caches: list[KvCache], tokens: list[int]) -> npt.NDArray[np.float32]:
        """One token for each cache in one pass over the weights; logits ``[B, vocab]``."""
        ...
    def embed(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """The float32 embedding rows of ``ids``."""
        ...
    @property
    def threads(self) -> int: ...
    @property
    def activations(self) -> str: ...
    @property
    def residency(self) -> str:
        """``"mapped"`` or ``"copied"`` (into the process's memory, in huge pages)."""
        ...
    @property
    def mapped_bytes(self) -> int: ...
