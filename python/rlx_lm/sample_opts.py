"""Sampling options: every knob of the sampler chain, validated at construction."""

from __future__ import annotations

import enum
import math
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, NoReturn

from rlx_lm.errors import InvalidOptionError

if TYPE_CHECKING:
    from rlx_lm._core import SamplerChain

__all__ = ["ORDER_PRESETS", "STAGE_NAMES", "LogitBias", "MirostatMode", "SampleOpts"]

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


class LogitBias(dict[int, float]):
    """The read-only token -> bias mapping of `SampleOpts.logit_bias`.

    A ``dict`` that refuses every change, so that it pickles, deep-copies and goes through
    `dataclasses.asdict` like a plain dict, and compares equal to one with the same items.
    """

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("SampleOpts.logit_bias is read-only; build new options with replace()")

    __setitem__ = __delitem__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))

    def __reduce__(self) -> tuple[type[LogitBias], tuple[dict[int, float]]]:
        return (LogitBias, (dict(self),))

    def __copy__(self) -> LogitBias:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> LogitBias:
        return self

    def __repr__(self) -> str:
        return f"LogitBias({dict.__repr__(self)})"


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


def _json_key(k: object) -> object:
    """A token id key, also from JSON, where object keys are strings."""
    if isinstance(k, str):
        try:
            return int(k)
        except ValueError:
            raise _fail("logit_bias", f"keys must be token ids, got {k!r}") from None
    return k


def _from_dict(data: dict[str, Any]) -> SampleOpts:
    return SampleOpts.from_dict(data)


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
    repetition_window: int | None = None
    min_keep: int = 1
    seed: int | None = None
    logit_bias: Mapping[int, float] = field(default_factory=LogitBias)

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
        if self.repetition_window is not None:
            w = _integer("repetition_window", self.repetition_window)
            _in(
                "repetition_window",
                w,
                w >= 1 or w == -1,
                ">= 1, -1 for the whole history, or None for the order's default",
            )
        mk = _integer("min_keep", self.min_keep)
        _in("min_keep", mk, mk >= 1, ">= 1 (a stage must keep at least one token)")
        readers = (
            self.top_k,
            self.top_p < 1,
            self.min_p > 0,
            self.typical_p < 1,
            self.xtc_prob > 0,
        )
        if mk > 1 and not any(readers):
            raise _fail(
                "min_keep",
                f"{mk} but no stage that reads it is set (top_k, top_p, min_p, typical_p, "
                "xtc_prob): it would change nothing; leave it at 1",
            )
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
        set_(self, "logit_bias", LogitBias(bias))

    def __hash__(self) -> int:
        return hash(
            tuple(
                tuple(sorted(v.items())) if isinstance(v, Mapping) else v
                for v in (getattr(self, f.name) for f in fields(self))
            )
        )

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        # Through from_dict, so that an unpickled value is validated like a new one.
        return (_from_dict, (self.to_dict(),))

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain Python values (JSON-ready: lists, ints, floats, None).

        ``mirostat`` becomes its int, tuples become lists and ``logit_bias`` a plain dict
        with int keys (`json.dumps` turns those into strings; `from_dict` takes both).
        """
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Mapping):
                v = dict(v)
            elif isinstance(v, tuple):
                v = list(v)
            elif isinstance(v, enum.IntEnum):
                v = int(v)
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SampleOpts:
        """Options from `to_dict`'s output (or its JSON round trip), validated as new.

        Missing fields keep their defaults; an unknown field is refused.
        """
        if not isinstance(data, Mapping):
            raise _fail(
                "from_dict", f"expected a mapping of field names, got {type(data).__name__}"
            )
        names = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in data if k not in names)
        if unknown:
            raise _fail(
                unknown[0], f"is not a SampleOpts field (fields: {', '.join(sorted(names))})"
            )
        kw: dict[str, Any] = dict(data)
        if isinstance(kw.get("dynamic_temp"), list):
            kw["dynamic_temp"] = tuple(kw["dynamic_temp"])
        bias = kw.get("logit_bias")
        if isinstance(bias, Mapping):
            kw["logit_bias"] = {_json_key(k): v for k, v in bias.items()}
        return cls(**kw)

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

        if isinstance(sequence_id, bool) or not isinstance(sequence_id, int):
            raise _fail("sequence_id", f"must be an integer, got {type(sequence_id).__name__}")
        if not 0 <= sequence_id < 2**64:
            raise _fail("sequence_id", f"must be in 0..2**64, got {sequence_id}")
        opts: Any = self
        if self.seed is None:
            import dataclasses

            opts = dataclasses.replace(self, seed=secrets.randbits(64))
        if order is not None and not isinstance(order, str):
            order = list(order)
        return SamplerChain(opts, order, sequence_id)
