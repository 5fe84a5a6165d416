"""Sampling options: every knob of the sampler chain, validated at construction."""

from __future__ import annotations

import enum
import math
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from rlx_lm.errors import InvalidOptionError

if TYPE_CHECKING:
    from rlx_lm._core import SamplerChain

__all__ = ["ORDER_PRESETS", "STAGE_NAMES", "MirostatMode", "SampleOpts"]

#: Names accepted by ``SampleOpts.into_chain(order=...)``.
ORDER_PRESETS: tuple[str, ...] = ("default", "llama.cpp", "hf", "vllm")

#: Stage names for a custom order, in the default order.
STAGE_NAMES: tuple[str, ...] = (
    "logit_bias",
    "penalties",
    "dry",
    "temperature",
    "top_k",
    "typical",
    "top_p",
    "min_p",
    "top_n_sigma",
    "xtc",
)


class MirostatMode(enum.IntEnum):
    """Which mirostat, if any, replaces the final draw."""

    OFF = 0
    V1 = 1
    V2 = 2


def _fail(name: str, reason: str) -> InvalidOptionError:
    return InvalidOptionError(f"{name}: {reason}")


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(name, f"must be a number, got {type(value).__name__}")
    v = float(value)
    if math.isnan(v) or math.isinf(v):
        raise _fail(name, f"must be a finite number, got {v}")
    return v


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(name, f"must be an integer, got {type(value).__name__}")
    return int(value)


def _token(name: str, value: object) -> int:
    t = _integer(name, value)
    if not 0 <= t < 2**32:
        raise _fail(name, f"token ids must be in 0..2**32, got {t}")
    return t


def _in(name: str, v: float, ok: bool, expected: str) -> None:
    if not ok:
        raise _fail(name, f"must be {expected}, got {v}")


@dataclass(frozen=True)
class SampleOpts:
    """Sampling knobs; the defaults are greedy decoding with every other stage off."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None
    repetition_penalty: float = 1.0
    dynamic_temp: tuple[float, float] | None = None
    dynamic_temp_exponent: float = 1.0
    typical_p: float = 1.0
    top_n_sigma: float = 0.0
    min_p: float = 0.0
    xtc_threshold: float = 0.0
    xtc_prob: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_max_ngram: int = 32
    dry_sequence_breakers: tuple[int, ...] = ()
    mirostat: MirostatMode = MirostatMode.OFF
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    mirostat_m: int = 100
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_window: int = 64
    min_keep: int = 1
    seed: int | None = None
    logit_bias: Mapping[int, float] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.type in ("float",):
                _number(f.name, getattr(self, f.name))
        set_ = object.__setattr__
        t = _number("temperature", self.temperature)
        _in("temperature", t, t >= 0, ">= 0 (0 = greedy)")
        _in("top_p", self.top_p, 0 < self.top_p <= 1, "in (0, 1]")
        _in("min_p", self.min_p, 0 <= self.min_p <= 1, "in [0, 1]")
        _in("typical_p", self.typical_p, 0 < self.typical_p <= 1, "in (0, 1]")
        _in("top_n_sigma", self.top_n_sigma, self.top_n_sigma >= 0, ">= 0 (0 = off)")
        rp = self.repetition_penalty
        _in("repetition_penalty", rp, rp > 0, "> 0 (1 = off)")
        if self.top_k is not None:
            k = _integer("top_k", self.top_k)
            _in("top_k", k, k >= 0, ">= 0 (0 or None = off)")
        if self.dynamic_temp is not None:
            try:
                lo, hi = self.dynamic_temp
            except (TypeError, ValueError):
                raise _fail("dynamic_temp", "must be a (min, max) pair or None") from None
            lo, hi = _number("dynamic_temp", lo), _number("dynamic_temp", hi)
            _in("dynamic_temp", lo, lo >= 0, "a range with min >= 0")
            if lo > hi:
                raise _fail("dynamic_temp", f"min {lo} is greater than max {hi}")
            if self.temperature != 0:
                raise _fail(
                    "temperature",
                    "dynamic_temp replaces temperature: leave temperature at 0 when setting it",
                )
            set_(self, "dynamic_temp", (lo, hi))
        e = self.dynamic_temp_exponent
        _in("dynamic_temp_exponent", e, e >= 0, ">= 0")
        _in("xtc_prob", self.xtc_prob, 0 <= self.xtc_prob <= 1, "in [0, 1]")
        _in("xtc_threshold", self.xtc_threshold, 0 <= self.xtc_threshold <= 1, "in [0, 1]")
        if self.xtc_prob > 0 and self.xtc_threshold <= 0:
            raise _fail("xtc_threshold", "must be > 0 when xtc_prob > 0")
        _in("dry_multiplier", self.dry_multiplier, self.dry_multiplier >= 0, ">= 0 (0 = off)")
        _in("dry_base", self.dry_base, self.dry_base >= 1, ">= 1")
        al = _integer("dry_allowed_length", self.dry_allowed_length)
        _in("dry_allowed_length", al, al >= 1, ">= 1")
        mn = _integer("dry_max_ngram", self.dry_max_ngram)
        _in("dry_max_ngram", mn, mn >= 0, ">= 0 (0 = no cap)")
        breakers: object = self.dry_sequence_breakers
        if isinstance(breakers, (str, bytes)) or not isinstance(breakers, Iterable):
            raise _fail("dry_sequence_breakers", "must be a sequence of token ids")
        set_(
            self,
            "dry_sequence_breakers",
            tuple(_token("dry_sequence_breakers", t) for t in breakers),
        )
        try:
            set_(self, "mirostat", MirostatMode(self.mirostat))
        except ValueError:
            raise _fail(
                "mirostat", f"must be a MirostatMode (0, 1, 2), got {self.mirostat!r}"
            ) from None
        _in("mirostat_tau", self.mirostat_tau, self.mirostat_tau >= 0, ">= 0")
        _in("mirostat_eta", self.mirostat_eta, self.mirostat_eta >= 0, ">= 0")
        m = _integer("mirostat_m", self.mirostat_m)
        _in("mirostat_m", m, m >= 2, ">= 2")
        w = _integer("repetition_window", self.repetition_window)
        _in("repetition_window", w, w >= 1 or w == -1, ">= 1, or -1 for the whole history")
        mk = _integer("min_keep", self.min_keep)
        _in("min_keep", mk, mk >= 1, ">= 1 (a stage must keep at least one token)")
        if self.seed is not None:
            s = _integer("seed", self.seed)
            _in("seed", s, 0 <= s < 2**64, "in 0..2**64 or None")
        if not isinstance(self.logit_bias, Mapping):
            raise _fail("logit_bias", "must be a mapping of token id to bias")
        bias: dict[int, float] = {}
        for tok, b in self.logit_bias.items():
            t_id = _token("logit_bias", tok)
            if (
                isinstance(b, bool)
                or not isinstance(b, (int, float))
                or math.isnan(b)
                or b == math.inf
            ):
                raise _fail(
                    "logit_bias", f"bias for token {t_id} must be finite or -inf (ban), got {b!r}"
                )
            bias[t_id] = float(b)
        set_(self, "logit_bias", MappingProxyType(bias))

    def __hash__(self) -> int:
        return hash(
            tuple(
                tuple(sorted(v.items())) if isinstance(v, Mapping) else v
                for v in (getattr(self, f.name) for f in fields(self))
            )
        )

    @classmethod
    def greedy(cls) -> SampleOpts:
        """Options for greedy decoding (the defaults)."""
        return cls()

    @classmethod
    def nucleus(cls, temperature: float, top_p: float) -> SampleOpts:
        """Options for temperature plus top-p sampling."""
        return cls(temperature=temperature, top_p=top_p)

    def is_greedy(self) -> bool:
        """Whether these options always pick the (penalised) argmax."""
        return (
            self.temperature <= 0
            and self.dynamic_temp is None
            and self.mirostat == MirostatMode.OFF
        )

    def is_classic(self) -> bool:
        """Whether only temperature, top-k and top-p are in use."""
        return (
            self.dynamic_temp is None
            and self.typical_p >= 1
            and self.top_n_sigma <= 0
            and self.min_p <= 0
            and self.xtc_prob <= 0
            and self.dry_multiplier <= 0
            and self.mirostat == MirostatMode.OFF
            and self.frequency_penalty == 0
            and self.presence_penalty == 0
            and self.repetition_penalty == 1
            and not self.logit_bias
        )

    def into_chain(
        self, order: str | Sequence[str] | None = None, *, sequence_id: int = 0
    ) -> SamplerChain:
        """Build the Rust sampler chain for these options.

        ``order`` is None (the default order), a preset name from
        ``ORDER_PRESETS``, or a list of names from ``STAGE_NAMES``. A seed of
        None is replaced by a random one, reported as ``chain.seed``.
        """
        from rlx_lm._core import SamplerChain

        opts: Any = self
        if self.seed is None:
            import dataclasses

            opts = dataclasses.replace(self, seed=secrets.randbits(64))
        if order is not None and not isinstance(order, str):
            order = list(order)
        return SamplerChain(opts, order, sequence_id)
