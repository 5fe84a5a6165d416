"""The reference Llama-family runner: llama, mistral, qwen2, qwen3, gemma 1-3 on the Rust engine.

`LlamaRunner` meets the whole runner contract natively: cached ``prefill_logits`` /
``decode_logits`` over one session `rlx_lm.KvCache` (one decode step is one call into the
Rust engine, GIL released), ``predict_logits`` on a throwaway cache, ``generate`` on the
cached pair (greedy, or with the `SampleOpts` it was built with), session export/restore,
prefix reuse and batched decode of many sessions in one pass over the weights. `load_llama`
reads GGUF files (split ones from their first shard), safetensors files and HF/MLX
directories, with the weights memory-mapped and used as stored (or dequantised to float32
with ``packed=False``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import numpy as np
import numpy.typing as npt

from rlx_lm._core import Engine, KvCache, argmax
from rlx_lm.config import Activations, KvDtype
from rlx_lm.errors import (
    CapacityError,
    InvalidOptionError,
    SequenceStateError,
    ShapeError,
    SnapshotMismatchError,
    TokenOutOfRangeError,
    UnsupportedError,
    WeightFormatError,
)
from rlx_lm.progress import current_load_progress, load_progress
from rlx_lm.registry import match_architectures, register_model
from rlx_lm.runners.llama_config import HF_MODEL_TYPES, LLAMA_ARCHITECTURES, LlamaConfig
from rlx_lm.runners.llama_engine import (
    EngineLoad,
    load_gguf_engine,
    load_safetensors_engine,
)
from rlx_lm.runners.safetensors_loader import locate_safetensors, read_config_json
from rlx_lm.sample_opts import SampleOpts
from rlx_lm.session import ModelFingerprint, SessionSnapshot

if TYPE_CHECKING:
    from rlx_lm.builder import LmRunnerBuilder

__all__ = ["FAMILY", "LlamaRunner", "load_from_builder", "load_llama", "load_progress"]

FAMILY = "llama"

F32 = npt.NDArray[np.float32]
ProgressCallback = Callable[[int, int], None]
"""Called with ``(tokens_done, tokens_total)`` after each prefill chunk."""


def _new_cache(cfg: LlamaConfig, max_seq: int, dtype: KvDtype = "float32") -> KvCache:
    return KvCache(
        n_layers=cfg.n_layers,
        n_kv_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
        max_seq=max_seq,
        dtype=dtype,
    )


class LlamaRunner:
    """A Llama/Mistral/Qwen2/Qwen3 model on the Rust engine, with a cached decode session."""

    def __init__(
        self,
        loaded: EngineLoad,
        *,
        max_seq: int = 128,
        chunk: int = 128,
        source: str = "",
        kv_dtype: KvDtype = "float32",
        sample: SampleOpts | None = None,
    ) -> None:
        if max_seq <= 0:
            raise InvalidOptionError(f"max_seq must be positive, got {max_seq}")
        if chunk <= 0:
            raise InvalidOptionError(f"chunk must be positive, got {chunk}")
        if loaded.longrope is not None and (max_seq > loaded.longrope[0]) != loaded.longrope[1]:
            original, long = loaded.longrope
            raise InvalidOptionError(
                f"max_seq={max_seq}: this model's LongRoPE factors were chosen at load for "
                f"sessions {'longer than' if long else 'of at most'} {original} tokens; "
                "load it again with this max_seq"
            )
        self.loaded = loaded
        self.cfg = loaded.cfg
        self.engine: Engine = loaded.engine
        self.source = source
        self.chunk = chunk
        self._max_seq = max_seq
        self.kv_dtype = kv_dtype
        if sample is not None and not isinstance(sample, SampleOpts):
            raise InvalidOptionError(f"sample: expected SampleOpts, got {type(sample).__name__}")
        self.sample_opts: SampleOpts = sample if sample is not None else SampleOpts.greedy()
        """How `generate` picks each token (greedy by default; the builder's ``sample``)."""
        self._cache = _new_cache(self.cfg, max_seq, kv_dtype)
        self._tokens: list[int] = []
        self._progress: ProgressCallback | None = None
        self._phase_callback: Callable[[str], None] | None = None
        self._stats_source: Any = None
        self.fingerprint = ModelFingerprint(
            FAMILY, self.cfg.geometry, _model_id(loaded), kv_dtype=kv_dtype
        )

    def clone(self, *, max_seq: int | None = None) -> LlamaRunner:
        """A runner over the same loaded weights with a session of its own."""
        return LlamaRunner(
            self.loaded,
            max_seq=self._max_seq if max_seq is None else max_seq,
            chunk=self.chunk,
            source=self.source,
            kv_dtype=self.kv_dtype,
            sample=self.sample_opts,
        )

    def __repr__(self) -> str:
        c = self.cfg
        return (
            f"LlamaRunner(arch={c.arch!r}, layers={c.n_layers}, hidden={c.hidden_size}, "
            f"heads={c.n_heads}/{c.n_kv_heads}, vocab={c.vocab_size}, max_seq={self._max_seq})"
        )

    # ------------------------------------------------------------- identity

    @property
    def family(self) -> str:
        """The registry family, ``"llama"`` (the architecture is ``cfg.arch``)."""
        return FAMILY

    @property
    def vocab_size(self) -> int:
        """Number of logits per position."""
        return self.cfg.vocab_size

    @property
    def max_seq(self) -> int:
        """Capacity of the session cache in tokens."""
        return self._max_seq

    @property
    def threads(self) -> int:
        """Threads of the engine's own pool."""
        return int(self.engine.threads)

    @property
    def residency(self) -> str:
        """How the weights are held: ``"mapped"`` (the files memory-mapped) or ``"copied"``
        (into this process's memory at load; see `load_llama`'s ``use_mmap``)."""
        return str(self.engine.residency)

    @property
    def activations(self) -> Activations:
        """``"exact"`` (float32 activations) or ``"q8"`` (8-bit, integer dot products)."""
        return "q8" if self.engine.activations == "q8" else "exact"

    @property
    def packed(self) -> bool:
        """Whether the weights are multiplied as stored (False: dequantised to float32)."""
        return self.loaded.packed

    @property
    def dequantised_tensors(self) -> dict[str, str]:
        """Tensors with no kernel, dequantised to float32 at load (name -> stored type)."""
        return dict(self.loaded.dequantised)

    @property
    def tokens(self) -> tuple[int, ...]:
        """The tokens of the current session (prompt and decoded tokens)."""
        return tuple(self._tokens)

    def set_progress_callback(self, callback: ProgressCallback | None) -> None:
        """Register (or clear) a ``(done, total)`` callback fired after each prefill chunk."""
        self._progress = callback

    def attach_prompt_cache(self, cache: Any) -> None:
        """Report the occupancy of ``cache`` (anything with ``kv_store_stats``) as this runner's."""
        self._stats_source = cache

    # --------------------------------------------------------------- checks

    def _ids(
        self, prompt_ids: Sequence[int] | npt.NDArray[np.integer[Any]]
    ) -> npt.NDArray[np.intp]:
        ids = np.asarray(prompt_ids)
        if ids.ndim != 1:
            raise InvalidOptionError(f"prompt_ids must be a flat sequence, got shape {ids.shape}")
        if ids.size == 0:
            raise InvalidOptionError("prompt_ids is empty; a prompt needs at least one token")
        if ids.dtype.kind not in "iu":
            raise InvalidOptionError(f"prompt_ids must be integers, got dtype {ids.dtype}")
        bad = (ids < 0) | (ids >= self.vocab_size)
        if bad.any():
            pos = int(np.argmax(bad))
            raise TokenOutOfRangeError(
                f"token {int(ids[pos])} at position {pos} is outside the vocabulary "
                f"(0..{self.vocab_size - 1})"
            )
        return ids.astype(np.intp, copy=False)

    def _fits(self, n: int) -> None:
        if n > self._max_seq:
            raise CapacityError(
                f"{n} tokens do not fit the session cache of max_seq={self._max_seq}; "
                "build the runner with a larger max_seq"
            )

    def _prefill(self, ids: npt.NDArray[np.intp], cache: KvCache, start: int) -> F32:
        """Feed ``ids`` to ``cache`` in chunks (the engine appends); the last logits row."""
        ids64 = np.ascontiguousarray(ids, dtype=np.int64)
        cb = self._progress
        logits: F32 | None = None
        for lo in range(0, len(ids64), self.chunk):
            hi = min(lo + self.chunk, len(ids64))
            logits = self.engine.forward(cache, ids64[lo:hi])
            if cb is not None:
                cb(start + hi, start + len(ids64))
        assert logits is not None
        return logits

    def _run(self, ids: npt.NDArray[np.intp], start: int) -> F32:
        """Prefill ``ids`` on the session cache from ``start``; on failure roll the cache back."""
        try:
            return self._prefill(ids, self._cache, start)
        except BaseException:
            self._cache.truncate(min(start, self._cache.len()))
            raise

    # ------------------------------------------------------------ contract

    def predict_logits(self, prompt_ids: Sequence[int], /) -> F32:
        """Last-position logits of ``prompt_ids`` from scratch (the session is left alone)."""
        ids = self._ids(prompt_ids)
        cache = _new_cache(self.cfg, len(ids), self.kv_dtype)
        ids64 = np.ascontiguousarray(ids, dtype=np.int64)
        logits: F32 | None = None
        for lo in range(0, len(ids64), self.chunk):
            logits = self.engine.forward(cache, ids64[lo : lo + self.chunk])
        assert logits is not None
        return logits

    def prefill_logits(self, prompt_ids: Sequence[int], /) -> F32:
        """Start a new session from ``prompt_ids``; return the last position's logits."""
        ids = self._ids(prompt_ids)
        self._fits(len(ids))
        self._cache.clear()
        self._tokens = []
        logits = self._run(ids, 0)
        self._tokens = [int(t) for t in ids]
        return logits

    def decode_logits(self, token: int, /) -> F32:
        """Append ``token`` to the session; return the next position's logits."""
        if not self._tokens:
            raise SequenceStateError(
                f"{self.family}: decode_logits before prefill_logits; there is no sequence "
                "to continue"
            )
        tok = self._token(token)
        self._fits(len(self._tokens) + 1)
        logits: F32 = self.engine.decode(self._cache, tok)
        self._tokens.append(tok)
        return logits

    def _token(self, token: object) -> int:
        if isinstance(token, bool) or not isinstance(token, int | np.integer):
            raise InvalidOptionError(f"a token must be an integer, got {token!r}")
        tok = int(token)
        if not 0 <= tok < self.vocab_size:
            raise TokenOutOfRangeError(
                f"token {tok} is outside the vocabulary (0..{self.vocab_size - 1})"
            )
        return tok

    def decode_batch(
        self, sessions: Sequence[SessionSnapshot], tokens: Sequence[int], /
    ) -> tuple[F32, list[SessionSnapshot]]:
        """Decode ``tokens[i]`` after ``sessions[i]`` for every i in one pass over the weights.

        Each sequence gets its own cache restored from its snapshot (rows shared, not copied);
        row i equals ``restore_session(sessions[i])`` then ``decode_logits(tokens[i])`` bit for
        bit. The given sessions are left as they were; the runner's own session is untouched.
        """
        if len(sessions) != len(tokens):
            raise ShapeError(
                f"decode_batch needs one token per session, got {len(sessions)} sessions "
                f"and {len(tokens)} tokens"
            )
        toks = [self._token(t) for t in tokens]
        caches: list[KvCache] = []
        for i, snap in enumerate(sessions):
            if not isinstance(snap, SessionSnapshot):
                raise TypeError(f"session #{i} is {type(snap).__name__}, not a SessionSnapshot")
            if len(snap.tokens) + 1 > self._max_seq:
                raise CapacityError(
                    f"session #{i} holds {len(snap.tokens)} tokens; one more does not fit "
                    f"max_seq={self._max_seq}"
                )
            cache = _new_cache(self.cfg, self._max_seq, self.kv_dtype)
            if snap.kv is None:
                if snap.fingerprint is not None:
                    snap.check(self.fingerprint)
                if snap.tokens:
                    self._prefill(self._ids(list(snap.tokens)), cache, 0)
            else:
                self._check_snapshot(snap)
                snap.restore_into(cache, self.fingerprint)
            caches.append(cache)
        if not caches:
            return np.empty((0, self.vocab_size), dtype=np.float32), []
        logits: F32 = self.engine.decode_batch(caches, toks)
        advanced = [
            s.advanced(c.snapshot(), t, self.fingerprint)
            for c, s, t in zip(caches, sessions, toks, strict=True)
        ]
        return logits, advanced

    def generate(
        self,
        prompt_ids: Sequence[int],
        n_new: int,
        on_token: Callable[[int], bool] | None = None,
        /,
    ) -> list[int]:
        """Decoding on the cached pair; each token is kept, then ``on_token`` False stops.

        Tokens are the argmax when ``sample_opts`` is greedy (the default), else drawn by
        its `SamplerChain`, which sees the prompt then the output (``prompt_len`` set).
        """
        if n_new < 0:
            raise InvalidOptionError(f"n_new must be >= 0, got {n_new}")
        if n_new == 0:
            return []
        self._fits(len(prompt_ids) + n_new - 1)
        chain = None if self.sample_opts.is_greedy() else self.sample_opts.into_chain()
        logits = self.prefill_logits(prompt_ids)
        history = np.empty(len(self._tokens) + n_new, dtype=np.int64)
        history[: len(self._tokens)] = self._tokens
        filled = prompt_len = len(self._tokens)
        out: list[int] = []
        for i in range(n_new):
            if chain is None:
                tok = argmax(logits)
            else:
                tok = int(chain.sample(logits, history[:filled], prompt_len=prompt_len))
                history[filled] = tok
                filled += 1
            out.append(tok)
            if (on_token is not None and not on_token(tok)) or i == n_new - 1:
                break
            logits = self.decode_logits(tok)
        return out

    def export_session(self) -> SessionSnapshot:
        """Snapshot the session (KV blocks shared copy-on-write, tokens, fingerprint)."""
        return SessionSnapshot(self._cache.snapshot(), self._tokens, self.fingerprint)

    def _check_snapshot(self, snap: SessionSnapshot) -> None:
        if snap.fingerprint is None:
            raise SnapshotMismatchError(
                f"snapshot has no model fingerprint; this runner only restores its own "
                f"({self.fingerprint})"
            )
        snap.check(self.fingerprint, self._cache)

    def restore_session(self, snapshot: SessionSnapshot, /) -> bool:
        """Resume from ``snapshot``; a snapshot of another model raises SnapshotMismatchError."""
        self._check_snapshot(snapshot)
        snapshot.restore_into(self._cache, self.fingerprint)
        self._tokens = list(snapshot.tokens)
        return True

    def prefill_logits_reusing(
        self, prompt_ids: Sequence[int], snapshot: SessionSnapshot, reuse_len: int, /
    ) -> F32:
        """Prefill ``prompt_ids`` whose first ``reuse_len`` tokens ``snapshot`` covers: only the
        suffix is computed (the last prompt token always is, to produce logits)."""
        ids = self._ids(prompt_ids)
        self._check_snapshot(snapshot)
        self._fits(len(ids))
        if not 0 <= reuse_len <= min(len(ids), len(snapshot.tokens)):
            raise InvalidOptionError(
                f"reuse_len={reuse_len} is outside 0..{min(len(ids), len(snapshot.tokens))}"
            )
        if tuple(int(t) for t in ids[:reuse_len]) != snapshot.tokens[:reuse_len]:
            raise SnapshotMismatchError(
                f"the snapshot's first {reuse_len} tokens differ from the prompt's"
            )
        keep = min(reuse_len, len(ids) - 1)
        snapshot.restore_into(self._cache, self.fingerprint, keep)
        self._tokens = [int(t) for t in ids[:keep]]
        logits = self._run(ids[keep:], keep)
        self._tokens = [int(t) for t in ids]
        return logits

    def kv_store_stats(self) -> tuple[int, int, int] | None:
        """``(blocks, tokens, disk_bytes)`` of an attached prompt cache, else None."""
        src = self._stats_source
        if src is None:
            return None
        stats = src.kv_store_stats()
        return None if stats is None else (int(stats[0]), int(stats[1]), int(stats[2]))

    def set_multimodal_phase_callback(self, callback: Callable[[str], None] | None, /) -> None:
        """Text-only model: kept for the contract, never fired."""
        self._phase_callback = callback

    def supports_multimodal(self) -> bool:
        """Text-only: False."""
        return False

    def generate_multimodal(
        self,
        prompt: str,
        rgb: bytes,
        img_w: int,
        img_h: int,
        tokenizer: str | PathLike[str] | None,
        n_new: int,
        on_token: Callable[[int], bool] | None = None,
        /,
    ) -> list[int]:
        """Text-only model: raises UnsupportedError."""
        raise UnsupportedError(f"{self.family}: {self.cfg.arch} is a text-only model")


def _model_id(loaded: EngineLoad) -> str:
    """A short hash of the configuration and a sample of the weights."""
    cfg = loaded.cfg
    h = hashlib.sha256(repr(cfg).encode())
    h.update(loaded.engine.embed(np.array([0, cfg.vocab_size - 1], dtype=np.int64)).tobytes())
    h.update(loaded.sample)
    return h.hexdigest()[:16]


def load_llama(
    path: str | PathLike[str],
    *,
    config: LlamaConfig | Mapping[str, Any] | str | PathLike[str] | None = None,
    packed: bool | None = None,
    max_seq: int = 128,
    chunk: int = 128,
    on_progress: ProgressCallback | None = None,
    kv_dtype: KvDtype = "float32",
    threads: int | None = None,
    activations: Activations = "exact",
    use_mmap: bool | None = None,
) -> LlamaRunner:
    """Load a GGUF file (a split one from its first shard), a safetensors file, or a
    Hugging Face / MLX directory onto the Rust engine.

    ``config`` overrides where the hyper-parameters come from: a `LlamaConfig`, a
    config.json-style mapping, or a path to a JSON file (default: embedded in the GGUF,
    or config.json beside the safetensors). Weights are memory-mapped and multiplied as
    stored (``packed`` None or True); ``packed=False`` dequantises every tensor not stored
    as float32 to float32 at load instead (4 bytes a weight). ``threads`` sizes the
    engine's own pool (default: the cores this process may use). ``on_progress(done,
    total)`` follows the load steps (default: the callback of an enclosing `load_progress`
    block). ``kv_dtype="float16"`` halves the KV cache. ``activations="q8"`` quantises
    activations to 8 bits as llama.cpp does (integer dot products, faster; default
    ``"exact"``, see docs/kernels.md for the error). ``use_mmap`` (llama.cpp's name):
    True keeps the files memory-mapped, False copies them at load into the process's
    memory in huge pages (decode reads every weight a step, and in the file cache's small
    pages it misses the TLB), None (default) copies when the OS has transparent huge pages
    and the files take at most 1 GiB and half the memory available (a copy takes about
    0.2 s a GiB, more when the kernel must compact memory for huge pages first), else maps;
    `LlamaRunner.residency` says which.
    """
    if use_mmap is not None and not isinstance(use_mmap, bool):
        raise InvalidOptionError(f"use_mmap must be True, False or None, got {use_mmap!r}")
    if packed is not None and not isinstance(packed, bool):
        raise InvalidOptionError(f"packed must be True, False or None, got {packed!r}")
    keep = packed is not False
    p = Path(path)
    if not p.exists():
        raise WeightFormatError(f"{p}: no such file or directory")
    if threads is not None and (isinstance(threads, bool) or threads < 1):
        raise InvalidOptionError(f"threads must be a positive integer, got {threads!r}")
    if activations not in get_args(Activations):
        raise InvalidOptionError(f'activations must be "exact" or "q8", got {activations!r}')
    progress = on_progress or current_load_progress()
    explicit = _explicit_config(config)
    if p.is_file() and _is_gguf(p):
        loaded = load_gguf_engine(
            p,
            config=explicit,
            threads=threads,
            on_progress=progress,
            activations=activations,
            packed=keep,
            context=max_seq,
            use_mmap=use_mmap,
        )
    else:
        files, cfg_path = locate_safetensors(p)
        cfg = explicit or _config_beside(cfg_path, p)
        loaded = load_safetensors_engine(
            files,
            cfg,
            threads=threads,
            on_progress=progress,
            activations=activations,
            packed=keep,
            context=max_seq,
            use_mmap=use_mmap,
        )
    return LlamaRunner(loaded, max_seq=max_seq, chunk=chunk, source=str(p), kv_dtype=kv_dtype)


def _is_gguf(p: Path) -> bool:
    with p.open("rb") as fh:
        return fh.read(4) == b"GGUF"


def _explicit_config(
    config: LlamaConfig | Mapping[str, Any] | str | PathLike[str] | None,
) -> LlamaConfig | None:
    if config is None or isinstance(config, LlamaConfig):
        return config
    if isinstance(config, Mapping):
        return LlamaConfig.from_hf(config, where="explicit config")
    cp = Path(config)
    return LlamaConfig.from_hf(read_config_json(cp), where=str(cp))


def _config_beside(cfg_path: Path | None, weights: Path) -> LlamaConfig:
    if cfg_path is None:
        where = weights if weights.is_dir() else weights.parent
        raise WeightFormatError(
            f"{where}: no config.json beside the safetensors weights (pass a config explicitly)"
        )
    return LlamaConfig.from_hf(read_config_json(cfg_path), where=str(cfg_path))


@register_model(
    FAMILY,
    "The Llama family (Llama, Mistral, Qwen, Gemma, Phi-3, Granite, SmolLM3, OLMo 2, "
    "EXAONE 4, ERNIE 4.5; the mixtures of experts Mixtral, Qwen2-MoE, Qwen3-MoE, Granite "
    "MoE, OLMoE) on the Rust engine, weights memory-mapped (GGUF of every common type, "
    "safetensors, MLX)",
    matches=match_architectures(*LLAMA_ARCHITECTURES, *HF_MODEL_TYPES),
)
def load_from_builder(builder: LmRunnerBuilder) -> LlamaRunner:
    """Build a `LlamaRunner` from a resolved builder (weights, format, config, sizes, kv dtype)."""
    from rlx_lm.config import ConfigSource

    source = builder.config()
    config: LlamaConfig | Mapping[str, Any] | Path | None = None
    if isinstance(source, ConfigSource.JsonFile):
        config = source.path
    elif isinstance(source, ConfigSource.Explicit):
        value = source.value
        if not isinstance(value, LlamaConfig | Mapping):
            raise InvalidOptionError(
                f"explicit config for {FAMILY} must be a LlamaConfig or a config.json mapping, "
                f"got {type(value).__name__}"
            )
        config = value
    weights = builder.weights()
    if weights is None:
        raise InvalidOptionError("the builder has no weights path")
    runner = load_llama(
        weights,
        config=config,
        packed=builder.packed_weights(),
        max_seq=builder.max_seq(),
        kv_dtype=builder.kv_dtype(),
        threads=builder.threads(),
        activations=builder.activations(),
        use_mmap=builder.use_mmap(),
    )
    runner.sample_opts = builder.sample()
    return runner


if TYPE_CHECKING:
    from rlx_lm.runner import FullLmRunner

    def _meets_the_whole_contract(runner: LlamaRunner) -> FullLmRunner:
        """mypy proves here that LlamaRunner structurally satisfies every runner protocol."""
        return runner
