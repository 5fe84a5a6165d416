"""LmRunnerBuilder: the settings every family runner is built from, and ``build()``.

Each setting is one method that both reads and writes: ``b.max_seq()`` returns
the value, ``b.max_seq(256)`` returns a new builder with it changed. Builders
are immutable, so a partly configured builder can be shared and specialised
without one use leaking into another::

    base = LmRunnerBuilder(weights="model.gguf")
    runner = base.max_seq(512).build()

Every setting is also a keyword of the constructor, validated by its method:
``LmRunnerBuilder(weights="model.gguf", max_seq=512)``.

Because a setter returns a copy, ``b.max_seq(512)`` written as a statement
would change nothing; it is refused instead (`InvalidOptionError`), at the
line that wrote it. Assign the copy: ``b = b.max_seq(512)``.
"""

from __future__ import annotations

import enum
import math
import os
import re
import struct
import sys
import types
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Final, get_args, overload

from rlx_lm._discarded import reliable, result_discarded
from rlx_lm.config import (
    Activations,
    ConfigSource,
    Device,
    Embedded,
    Explicit,
    KvDtype,
    available_cores,
)
from rlx_lm.errors import InvalidOptionError, RlxError, UnsupportedError, WeightFormatError
from rlx_lm.runner import LmCore
from rlx_lm.sample_opts import SampleOpts
from rlx_lm.weights import WeightFormat, pick_gguf

__all__ = ["PACKED_GGUF_AUTO_THRESHOLD_BYTES", "KvDtype", "LmRunnerBuilder", "available_cores"]

PACKED_GGUF_AUTO_THRESHOLD_BYTES: Final = 256 * 1024 * 1024
"""GGUF files at least this large load packed (quantised in memory) unless told otherwise."""

GB: Final = 10**9
"""Bytes in one GB of ``max_memory_gb`` (decimal, as the name says)."""

_SHARD = re.compile(r"-(\d{5})-of-(\d{5})$")


_MALFORMED: Final = (
    KeyError,
    IndexError,
    TypeError,
    ValueError,
    AttributeError,
    ArithmeticError,
    RecursionError,
    EOFError,
    struct.error,
)
"""What a loader raises on malformed weights without meaning to (build() types it)."""


class _Unset(enum.Enum):
    TOKEN = 0


_UNSET: Final = _Unset.TOKEN


def _refuse_if_discarded(setting: str) -> None:
    """Raise when the caller's statement throws the new builder away.

    Walks out of this module's frames (a setter called by another, or by the
    constructor) to the caller's, and reads its bytecode: a call followed by
    POP_TOP is an expression statement, whose value is lost. Where that reading is
    not `rlx_lm._discarded.reliable` (another interpreter's bytecode, no frames),
    nothing is checked: the guard never raises a false alarm.
    """
    if not reliable():
        return
    try:
        frame: types.FrameType | None = sys._getframe(1)
    except (AttributeError, ValueError):  # pragma: no cover - not CPython
        return
    called = setting
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        if frame.f_code is LmRunnerBuilder.__init__.__code__:
            return
        called = frame.f_code.co_name  # the outermost is the method the caller called
        frame = frame.f_back
    if frame is None:  # pragma: no cover - called from this module only
        return
    try:
        discarded = result_discarded(frame)
    except Exception:  # pragma: no cover - bytecode this version cannot read
        return
    if discarded:
        raise InvalidOptionError(
            f"{called}(...) returns a new LmRunnerBuilder and changes nothing in place; "
            f"its result is discarded here, so the setting would be lost. Assign it "
            f"(b = b.{called}(...)), chain it, or pass it as LmRunnerBuilder({setting}=...)"
        )


@dataclass(frozen=True)
class _Fields:
    weights: Path | None = None
    config: ConfigSource = field(default_factory=Embedded)
    device: Device = Device.CPU
    max_seq: int = 128
    max_memory_gb: float | None = None
    stream: bool = True
    sample: SampleOpts = field(default_factory=SampleOpts.greedy)
    format: WeightFormat | None = None
    packed_weights: bool | None = None
    prefer_gguf: str | None = None
    kv_dtype: KvDtype = "float32"
    threads: int | None = None
    activations: Activations = "exact"
    use_mmap: bool | None = None


class LmRunnerBuilder:
    """Settings for building a runner; each method reads (no argument) or returns a changed copy.

    Defaults: no weights, embedded config, CPU, ``max_seq`` 128, no memory cap,
    streaming on, greedy sampling, format detected from the weights, packed
    loading automatic (GGUF of 256 MiB or more), ``Q4_K_M`` preferred when
    a directory holds several GGUF files, a float32 KV cache, as many
    compute threads as the process may use cores, exact float32 activations, and the
    weights copied into memory or mapped as the machine allows (``use_mmap`` None).
    """

    __slots__ = ("_f",)

    def __init__(
        self,
        *,
        weights: str | os.PathLike[str] | _Unset | None = _UNSET,
        config: ConfigSource | _Unset = _UNSET,
        device: Device | str | _Unset = _UNSET,
        max_seq: int | _Unset = _UNSET,
        max_memory_gb: float | _Unset | None = _UNSET,
        stream: bool | _Unset = _UNSET,
        sample: SampleOpts | _Unset = _UNSET,
        format: WeightFormat | str | _Unset | None = _UNSET,
        packed_weights: bool | _Unset | None = _UNSET,
        prefer_gguf: str | _Unset | None = _UNSET,
        kv_dtype: KvDtype | _Unset = _UNSET,
        threads: int | _Unset | None = _UNSET,
        activations: Activations | _Unset = _UNSET,
        use_mmap: bool | _Unset | None = _UNSET,
    ) -> None:
        """A builder with the defaults, changed by each keyword given (validated by its setter)."""
        self._f = _Fields()
        given = {
            "weights": weights,
            "config": config,
            "device": device,
            "max_seq": max_seq,
            "max_memory_gb": max_memory_gb,
            "stream": stream,
            "sample": sample,
            "format": format,
            "packed_weights": packed_weights,
            "prefer_gguf": prefer_gguf,
            "kv_dtype": kv_dtype,
            "threads": threads,
            "activations": activations,
            "use_mmap": use_mmap,
        }
        b: LmRunnerBuilder = self
        for name, value in given.items():
            if value is not _UNSET:
                b = getattr(b, name)(value)
        self._f = b._f

    def _with(self, **changes: Any) -> LmRunnerBuilder:
        """A setter's copy with ``changes``: refused when the caller's statement discards it."""
        _refuse_if_discarded(next(iter(changes)))
        return self._copy(**changes)

    def _copy(self, **changes: Any) -> LmRunnerBuilder:
        new = LmRunnerBuilder.__new__(LmRunnerBuilder)
        new._f = replace(self._f, **changes)
        return new

    def __repr__(self) -> str:
        parts = ", ".join(f"{f.name}={getattr(self._f, f.name)!r}" for f in fields(self._f))
        return f"LmRunnerBuilder({parts})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LmRunnerBuilder) and self._f == other._f

    __hash__ = None  # type: ignore[assignment]

    # -- settings -------------------------------------------------------------------

    @overload
    def weights(self, /) -> Path | None: ...
    @overload
    def weights(self, path: str | os.PathLike[str] | None, /) -> LmRunnerBuilder: ...
    def weights(
        self, path: str | os.PathLike[str] | _Unset | None = _UNSET, /
    ) -> Path | LmRunnerBuilder | None:
        """The weights file or directory."""
        if path is _UNSET:
            return self._f.weights
        return self._with(weights=None if path is None else Path(path))

    @overload
    def config(self, /) -> ConfigSource: ...
    @overload
    def config(self, source: ConfigSource, /) -> LmRunnerBuilder: ...
    def config(self, source: ConfigSource | _Unset = _UNSET, /) -> ConfigSource | LmRunnerBuilder:
        """Where the model configuration comes from (default: embedded in the weights)."""
        if source is _UNSET:
            return self._f.config
        if not isinstance(source, ConfigSource):
            raise TypeError(
                f"config: expected ConfigSource.Embedded(), .JsonFile(path) or "
                f".Explicit(value), got {type(source).__name__}; use config_value() for a "
                f"configuration object"
            )
        return self._with(config=source)

    def config_value(self, value: object, /) -> LmRunnerBuilder:
        """A copy using ``value`` as the model configuration (``ConfigSource.Explicit``)."""
        return self.config(Explicit(value))

    @overload
    def device(self, /) -> Device: ...
    @overload
    def device(self, device: Device | str, /) -> LmRunnerBuilder: ...
    def device(self, device: Device | str | _Unset = _UNSET, /) -> Device | LmRunnerBuilder:
        """The device to run on (default CPU)."""
        if device is _UNSET:
            return self._f.device
        return self._with(device=device if isinstance(device, Device) else Device.parse(device))

    @overload
    def max_seq(self, /) -> int: ...
    @overload
    def max_seq(self, n: int, /) -> LmRunnerBuilder: ...
    def max_seq(self, n: int | _Unset = _UNSET, /) -> int | LmRunnerBuilder:
        """The longest sequence (prompt plus generated tokens) the runner holds (default 128)."""
        if n is _UNSET:
            return self._f.max_seq
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidOptionError(f"max_seq must be a positive integer, got {n!r}")
        return self._with(max_seq=n)

    @overload
    def max_memory_gb(self, /) -> float | None: ...
    @overload
    def max_memory_gb(self, gb: float | None, /) -> LmRunnerBuilder: ...
    def max_memory_gb(
        self, gb: float | _Unset | None = _UNSET, /
    ) -> float | LmRunnerBuilder | None:
        """A cap on the runner's memory in GB (10^9 bytes), or None for no cap.

        The memory is the weights (as loaded: the file, or 4 bytes a weight with
        ``packed_weights(False)``) plus the KV cache at ``max_seq`` tokens. `build` refuses
        a ``max_seq`` whose cache does not fit beside the weights (`InvalidOptionError`
        naming both and the longest that fits, `fitting_max_seq`), and `rlx_lm.load_model`
        without ``max_seq`` picks a context that fits."""
        if gb is _UNSET:
            return self._f.max_memory_gb
        if gb is not None and (
            isinstance(gb, bool)
            or not isinstance(gb, (int, float))
            or not math.isfinite(gb)
            or gb <= 0
        ):
            raise InvalidOptionError(f"max_memory_gb must be a positive number, got {gb!r}")
        return self._with(max_memory_gb=None if gb is None else float(gb))

    @overload
    def stream(self, /) -> bool: ...
    @overload
    def stream(self, on: bool, /) -> LmRunnerBuilder: ...
    def stream(self, on: bool | _Unset = _UNSET, /) -> bool | LmRunnerBuilder:
        """Whether tokens are streamed as they are produced (default True).

        Every runner streams: its ``generate`` calls ``on_token`` with each token as it is
        produced, and `rlx_lm.stream` yields each one. ``stream(False)`` is refused
        (`UnsupportedError`): there is no runner that holds its tokens back; collect the
        whole text with `rlx_lm.generate` instead."""
        if on is _UNSET:
            return self._f.stream
        if not isinstance(on, bool):
            raise InvalidOptionError(f"stream must be True or False, got {on!r}")
        if not on:
            raise UnsupportedError(
                "stream: False is not supported; every runner streams its tokens as they are "
                "produced (on_token of generate, rlx_lm.stream); collect the whole text with "
                "rlx_lm.generate instead"
            )
        return self._with(stream=on)

    @overload
    def sample(self, /) -> SampleOpts: ...
    @overload
    def sample(self, opts: SampleOpts, /) -> LmRunnerBuilder: ...
    def sample(self, opts: SampleOpts | _Unset = _UNSET, /) -> SampleOpts | LmRunnerBuilder:
        """The sampling options of the runner's own ``generate`` (default greedy).

        The reference family's runner draws each token of ``generate(prompt_ids, n_new,
        on_token)`` with them (``runner.sample_opts``); `build` refuses non-greedy options
        for a family whose runner does not report taking them (`UnsupportedError`).
        `rlx_lm.generate` and `rlx_lm.stream` take their own ``opts``."""
        if opts is _UNSET:
            return self._f.sample
        if not isinstance(opts, SampleOpts):
            raise TypeError(f"sample: expected SampleOpts, got {type(opts).__name__}")
        return self._with(sample=opts)

    @overload
    def format(self, /) -> WeightFormat | None: ...
    @overload
    def format(self, fmt: WeightFormat | str | None, /) -> LmRunnerBuilder: ...
    def format(
        self, fmt: WeightFormat | str | _Unset | None = _UNSET, /
    ) -> WeightFormat | LmRunnerBuilder | None:
        """The weight format, or None to detect it from the weights."""
        if fmt is _UNSET:
            return self._f.format
        if isinstance(fmt, str):
            fmt = WeightFormat.parse(fmt)
        return self._with(format=fmt)

    @overload
    def packed_weights(self, /) -> bool | None: ...
    @overload
    def packed_weights(self, on: bool | None, /) -> LmRunnerBuilder: ...
    def packed_weights(self, on: bool | _Unset | None = _UNSET, /) -> bool | LmRunnerBuilder | None:
        """Whether to multiply the weights as stored (True) or dequantised to float32 (False).

        None leaves it to the family: the reference family always loads packed (its
        engine has a kernel for every block type); `resolved_packed` is the reference
        design's size rule for families that dequantise by default. `build` refuses an
        explicit value a family's runner does not report honouring (``runner.packed``)
        with `UnsupportedError` naming the setting."""
        if on is _UNSET:
            return self._f.packed_weights
        if on is not None and not isinstance(on, bool):
            raise InvalidOptionError(f"packed_weights must be True, False or None, got {on!r}")
        return self._with(packed_weights=on)

    @overload
    def prefer_gguf(self, /) -> str | None: ...
    @overload
    def prefer_gguf(self, substring: str | None, /) -> LmRunnerBuilder: ...
    def prefer_gguf(
        self, substring: str | _Unset | None = _UNSET, /
    ) -> str | LmRunnerBuilder | None:
        """The file-name substring that picks one GGUF from a directory (None: ``Q4_K_M``)."""
        if substring is _UNSET:
            return self._f.prefer_gguf
        if substring is not None and (not isinstance(substring, str) or not substring.strip()):
            raise InvalidOptionError(f"prefer_gguf must be a non-empty string, got {substring!r}")
        return self._with(prefer_gguf=substring)

    @overload
    def kv_dtype(self, /) -> KvDtype: ...
    @overload
    def kv_dtype(self, dtype: KvDtype, /) -> LmRunnerBuilder: ...
    def kv_dtype(self, dtype: KvDtype | _Unset = _UNSET, /) -> KvDtype | LmRunnerBuilder:
        """How the runner stores its KV cache: ``"float32"`` (default) or ``"float16"``."""
        if dtype is _UNSET:
            return self._f.kv_dtype
        if dtype not in get_args(KvDtype):
            raise InvalidOptionError(f'kv_dtype must be "float32" or "float16", got {dtype!r}')
        return self._with(kv_dtype=dtype)

    @overload
    def threads(self, /) -> int: ...
    @overload
    def threads(self, n: int | None, /) -> LmRunnerBuilder: ...
    def threads(self, n: int | _Unset | None = _UNSET, /) -> int | LmRunnerBuilder:
        """Compute threads of the runner's own pool (default, or None: the usable cores)."""
        if n is _UNSET:
            return self._f.threads if self._f.threads is not None else available_cores()
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise InvalidOptionError(f"threads must be a positive integer, got {n!r}")
        return self._with(threads=n)

    @overload
    def activations(self, /) -> Activations: ...
    @overload
    def activations(self, mode: Activations, /) -> LmRunnerBuilder: ...
    def activations(self, mode: Activations | _Unset = _UNSET, /) -> Activations | LmRunnerBuilder:
        """How activations meet the weights: ``"exact"`` float32 (default) or ``"q8"``.

        ``"q8"`` quantises them to 8 bits as llama.cpp does and uses integer dot products:
        faster, with logits off by about what llama.cpp's are (see docs/kernels.md)."""
        if mode is _UNSET:
            return self._f.activations
        if mode not in get_args(Activations):
            raise InvalidOptionError(f'activations must be "exact" or "q8", got {mode!r}')
        return self._with(activations=mode)

    @overload
    def use_mmap(self, /) -> bool | None: ...
    @overload
    def use_mmap(self, on: bool | None, /) -> LmRunnerBuilder: ...
    def use_mmap(self, on: bool | _Unset | None = _UNSET, /) -> bool | LmRunnerBuilder | None:
        """Whether the weight files stay memory-mapped (True, llama.cpp's default) or are
        copied at load into the process's memory in huge pages (False: faster decode on
        large models, the load copies the whole file: about 0.2 s a GiB). None (default):
        copied when the OS has transparent huge pages and the files take at most 1 GiB and
        half the memory available, else mapped. The runner's ``residency`` says which."""
        if on is _UNSET:
            return self._f.use_mmap
        if on is not None and not isinstance(on, bool):
            raise InvalidOptionError(f"use_mmap must be True, False or None, got {on!r}")
        return self._with(use_mmap=on)

    # -- resolution and build ----------------------------------------------------------

    def resolved_format(self) -> WeightFormat:
        """The explicit format, else the one detected from the weights path."""
        if self._f.format is not None:
            return self._f.format
        return WeightFormat.from_path(self._require_weights())

    def resolved_weights(self) -> Path:
        """The weights path to load: the single GGUF picked when the path is a directory of them."""
        path = self._require_weights()
        if path.is_dir() and self.resolved_format() is WeightFormat.GGUF:
            return pick_gguf(path, self._f.prefer_gguf)
        return path

    def resolved_packed(self, fmt: WeightFormat | None = None) -> bool:
        """Whether to load packed: the explicit setting, else GGUF of at least 256 MiB."""
        if self._f.packed_weights is not None:
            return self._f.packed_weights
        if (fmt or self.resolved_format()) is not WeightFormat.GGUF or self._f.weights is None:
            return False
        try:
            size = self.resolved_weights().stat().st_size
        except (OSError, ValueError):
            return False
        return size >= PACKED_GGUF_AUTO_THRESHOLD_BYTES

    def build(self) -> LmCore:
        """Load a runner through the family registry.

        Resolves the format and the weights file, reads the architecture from
        the weights' header, and calls the loader of the first registered
        family that matches, passing a copy of this builder whose ``weights()``
        is the concrete path and whose ``format()`` is set.
        """
        from rlx_lm._headers import read_safetensors_index
        from rlx_lm.registry import find_registration
        from rlx_lm.runner import _is_core
        from rlx_lm.weight_report import architecture_of

        fmt = self.resolved_format()
        path = self.resolved_weights()
        # Headers first, through the bounded readers: a hostile file is refused here,
        # before any loader allocates for it, and a shard index naming files outside
        # the model directory is refused before anything follows it.
        if path.is_dir():
            read_safetensors_index(path)
        registration = find_registration(architecture_of(path, fmt), path)
        if self._f.max_memory_gb is not None:
            self._check_memory(path, fmt)
        if registration.load is None:
            raise UnsupportedError(
                f"model family {registration.family!r} matched {path} but was registered "
                f"without a loader"
            )
        try:
            runner = registration.load(self._copy(weights=path, format=fmt))
        except RlxError:
            raise
        except _MALFORMED as exc:  # a loader tripping over a malformed model: say so, typed
            raise WeightFormatError(
                f"{path}: the {registration.family!r} loader could not read these weights "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        if not _is_core(runner):
            raise TypeError(
                f"the {registration.family!r} loader returned {type(runner).__name__}, which "
                f"lacks family, vocab_size or predict_logits"
            )
        self._check_honoured(runner, registration.family)
        return runner

    def _check_honoured(self, runner: object, family: str) -> None:
        """Refuse a setting the family's runner does not report honouring."""
        packed = self._f.packed_weights
        if packed is not None and getattr(runner, "packed", None) is not packed:
            raise UnsupportedError(
                f"packed_weights: the {family!r} runner does not report loading its weights "
                f"{'packed' if packed else 'dequantised'} (runner.packed); leave the setting "
                f"at None"
            )
        mmap = self._f.use_mmap
        want = {True: "mapped", False: "copied"}.get(mmap) if mmap is not None else None
        if want is not None and getattr(runner, "residency", None) != want:
            raise UnsupportedError(
                f"use_mmap: the {family!r} runner does not report holding its weights {want} "
                f"(runner.residency); leave the setting at None"
            )
        opts = self._f.sample
        if not opts.is_greedy() and getattr(runner, "sample_opts", None) != opts:
            raise UnsupportedError(
                f"sample: the {family!r} runner does not take sampling options (its "
                f"runner.sample_opts is not the builder's); pass opts to rlx_lm.generate or "
                f"rlx_lm.stream instead"
            )

    # -- memory ------------------------------------------------------------------------

    def weights_bytes(self) -> int:
        """Bytes the weights take once loaded: the files, or 4 a weight dequantised.

        ``packed_weights(False)`` counts every tensor not stored as float32 at 4 bytes a
        weight; otherwise the files' sizes (memory-mapped, used as stored)."""
        from rlx_lm._headers import read_gguf_header, read_safetensors_header

        fmt = self.resolved_format()
        path = self.resolved_weights()
        files = _gguf_shards(path) if fmt is WeightFormat.GGUF else _safetensors_files(path)
        if self._f.packed_weights is not False:
            return sum(f.stat().st_size for f in files)
        total = 0
        for f in files:
            if fmt is WeightFormat.GGUF:
                for t in read_gguf_header(f).tensors:
                    total += t.n_bytes if t.ggml_type == 0 else 4 * math.prod(t.shape)
            else:
                for dtype, shape in read_safetensors_header(f).tensors.values():
                    total += math.prod(shape) * (8 if dtype == "F64" else 4)
        return total

    def fitting_max_seq(self) -> int | None:
        """The longest ``max_seq`` whose KV cache fits ``max_memory_gb`` beside the weights.

        None without a cap. Raises `InvalidOptionError` naming ``max_memory_gb`` when not
        even one token fits, and `UnsupportedError` when the weights do not say the KV
        cache's geometry (layers, KV heads, head size), so the cap cannot be held."""
        from rlx_lm.context import kv_bytes_per_token

        cap = self._f.max_memory_gb
        if cap is None:
            return None
        path = self.resolved_weights()
        per_token = kv_bytes_per_token(path, self._f.kv_dtype)
        if not per_token:
            raise UnsupportedError(
                f"max_memory_gb: {path} does not give the KV cache's geometry (layers, KV "
                f"heads, head size), so a memory cap cannot be held"
            )
        weights = self.weights_bytes()
        room = int(cap * GB) - weights
        if room < per_token:
            raise InvalidOptionError(
                f"max_memory_gb: the weights take {weights / GB:.3g} GB, which leaves no room "
                f"for a KV cache in {cap:g} GB ({per_token} bytes a token)"
            )
        return room // per_token

    def _check_memory(self, path: Path, fmt: WeightFormat) -> None:
        fits = self.fitting_max_seq()
        assert fits is not None
        if self._f.max_seq > fits:
            raise InvalidOptionError(
                f"max_memory_gb: {self._f.max_memory_gb:g} GB holds the weights of {path.name} "
                f"and a KV cache of at most {fits} tokens, but max_seq is {self._f.max_seq}; "
                f"lower max_seq or raise the cap"
            )

    def _require_weights(self) -> Path:
        if self._f.weights is None:
            raise InvalidOptionError("weights: no weights path set; call .weights(path) first")
        return self._f.weights


def _gguf_shards(path: Path) -> list[Path]:
    """Every shard of a split GGUF named by its first (``-00001-of-00003``), else ``[path]``."""
    m = _SHARD.search(path.stem)
    if m is None:
        return [path]
    stem, count = path.stem[: m.start()], int(m.group(2))
    files = [path.with_name(f"{stem}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    return [f for f in files if f.is_file()]


def _safetensors_files(path: Path) -> list[Path]:
    """The weight files of a safetensors file or directory (its index's shards, else all)."""
    from rlx_lm._headers import read_safetensors_index

    if not path.is_dir():
        return [path]
    shards = read_safetensors_index(path)  # names confined to the directory
    files = list(shards) if shards is not None else sorted(path.glob("*.safetensors"))
    return [f for f in files if f.is_file()]
