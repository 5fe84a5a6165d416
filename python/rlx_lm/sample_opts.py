"""Sampling options: every knob of the sampler chain, validated at construction."""

from __future__ import annotations

import enum
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, NoReturn

from rlx_lm import _core
from rlx_lm.errors import InvalidOptionError

if TYPE_CHECKING:
    from rlx_lm._core import SamplerChain

__all__ = [
    "DRY_DEFAULT_BREAKERS",
    "KNOBS",
    "ORDER_PRESETS",
    "STAGE_NAMES",
    "LogitBias",
    "MirostatMode",
    "SampleOpts",
]

# The knobs, stages and presets are described once, in the Rust core
# (rust/sampling/knobs.rs and stages.rs); everything here is read from there.

#: Every knob as the core describes it (name, kind, default, range, help, llama.cpp flag),
#: in `SampleOpts`' field order.
KNOBS: tuple[dict[str, Any], ...] = _core.SAMPLER_KNOBS

#: llama.cpp's default DRY sequence breakers (``common_params_sampling``): the CLI and the
#: server use them when DRY is on and no breaker is given, as llama-cli and llama-server do
#: (``SampleOpts`` itself holds token ids and defaults to none; see
#: `rlx_lm.tokenizer.Tokenizer.ids_containing`).
DRY_DEFAULT_BREAKERS: tuple[str, ...] = ("\n", ":", '"', "*")

#: Names accepted by ``SampleOpts.into_chain(order=...)``.
ORDER_PRESETS: tuple[str, ...] = tuple(_core.SAMPLER_PRESETS)

#: Stage names for a custom order, in the default order.
STAGE_NAMES: tuple[str, ...] = tuple(s["name"] for s in _core.SAMPLER_STAGES)


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
        set_ = object.__setattr__
        # Containers into their frozen forms; every value is then checked by the one
        # validator, the core's knob table (the same check a SamplerChain makes).
        pair: Any = self.dynamic_temp
        if pair is not None:
            try:
                lo, hi = pair
            except (TypeError, ValueError):
                raise _fail("dynamic_temp", "must be a (min, max) pair or None") from None
            set_(self, "dynamic_temp", (lo, hi))
        breakers: object = self.dry_sequence_breakers
        if isinstance(breakers, (str, bytes)) or not isinstance(breakers, Iterable):
            raise _fail("dry_sequence_breakers", "must be a sequence of token ids")
        set_(self, "dry_sequence_breakers", tuple(breakers))
        if not isinstance(self.logit_bias, Mapping):
            raise _fail("logit_bias", "must be a mapping of token id to bias")
        set_(self, "logit_bias", dict(self.logit_bias))
        _core._validate_sample_opts(self)
        if pair is not None:
            set_(self, "dynamic_temp", (float(lo), float(hi)))
        set_(self, "dry_sequence_breakers", tuple(int(t) for t in self.dry_sequence_breakers))
        set_(self, "mirostat", MirostatMode(self.mirostat))
        bias = {int(t): float(b) for t, b in self.logit_bias.items()}
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
