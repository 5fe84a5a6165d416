"""Hypothesis strategies for property tests of runners and samplers.

* `finite_logits`, `adversarial_logits`, `logits_rows`: float32 rows, plain or nasty
  (ties, ``-inf``, magnitudes near float32's limits, subnormals, one- and two-token
  vocabularies). Every row has at least one finite value.
* `token_histories`: token id lists within a vocabulary, with repeats so that
  penalties and DRY have something to find.
* `sample_opts`: valid `rlx_lm.SampleOpts`, each knob at its default half the time so
  that failures shrink to the stage responsible, otherwise drawn from the core's knob
  table (`KNOB_TABLE`, `knob_values`); `valid_options` resets what the core refuses.

Importing this module needs hypothesis (``pip install 'rlx-lm[testing]'``).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

from rlx_lm.testing.options import require_hypothesis

require_hypothesis()

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

from rlx_lm import _core  # noqa: E402
from rlx_lm.errors import InvalidOptionError  # noqa: E402
from rlx_lm.sample_opts import ORDER_PRESETS, MirostatMode, SampleOpts  # noqa: E402

__all__ = [
    "KNOB_TABLE",
    "adversarial_logits",
    "finite_logits",
    "knob_values",
    "logits_rows",
    "sample_opts",
    "token_histories",
    "valid_options",
    "vocab_sizes",
]

Row = npt.NDArray[np.float32]
F32_MAX = float(np.finfo(np.float32).max)


def _flush(x: float) -> float:
    # A float64 knob below float32's normal range is refused by SampleOpts (it would
    # round to 0 in the chain); such draws mean "off", so they are drawn as 0.
    return 0.0 if abs(x) < 1e-30 else x


def _knob(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(lo, hi).map(_flush)


def _f32(x: float) -> float:
    return float(np.float32(x))


def vocab_sizes(min_size: int = 1, max_size: int = 256) -> st.SearchStrategy[int]:
    """Vocabulary sizes in ``[min_size, max_size]``, with the smallest ones drawn often."""
    if not 1 <= min_size <= max_size:
        raise ValueError(f"need 1 <= min_size <= max_size, got {min_size}, {max_size}")
    tiny = st.integers(min_size, min(max_size, min_size + 2))
    return st.one_of(tiny, st.integers(min_size, max_size))


def _sizes(vocab_size: int | None, min_vocab: int, max_vocab: int) -> st.SearchStrategy[int]:
    if vocab_size is not None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        return st.just(vocab_size)
    return vocab_sizes(min_vocab, max_vocab)


def _rows(
    sizes: st.SearchStrategy[int], elements: st.SearchStrategy[float]
) -> st.SearchStrategy[Row]:
    return sizes.flatmap(lambda n: hnp.arrays(np.float32, n, elements=elements))


def finite_logits(
    vocab_size: int | None = None, *, min_vocab: int = 1, max_vocab: int = 256
) -> st.SearchStrategy[Row]:
    """Float32 rows of finite values, of length ``vocab_size`` or a drawn size."""
    elements = st.floats(width=32, allow_nan=False, allow_infinity=False)
    return _rows(_sizes(vocab_size, min_vocab, max_vocab), elements)


@st.composite
def _with_a_finite_value(draw: st.DrawFn, rows: st.SearchStrategy[Row]) -> Row:
    row = draw(rows)
    if not np.isfinite(row).any():
        i = draw(st.integers(0, row.size - 1))
        row[i] = draw(st.floats(-10.0, 10.0, width=32))
    return row


def adversarial_logits(
    vocab_size: int | None = None, *, min_vocab: int = 1, max_vocab: int = 256
) -> st.SearchStrategy[Row]:
    """Rows that break careless samplers: ties, -inf, huge or subnormal values, tiny vocabularies.

    Every row has at least one finite value (a row banned entirely is an error, not a logit row).
    """
    sizes = _sizes(vocab_size, min_vocab, max_vocab)
    tiny_sizes = sizes if vocab_size is not None else st.integers(1, 2)
    ties = st.sampled_from([0.0, 1.0, -1.0, 2.5])
    neg_inf = st.one_of(st.just(-math.inf), st.floats(-5.0, 5.0, width=32))
    big, tiny = _f32(1e30), _f32(1.2e-38)
    huge = st.one_of(
        st.sampled_from([F32_MAX, -F32_MAX, _f32(1e38), _f32(-1e38), _f32(3e38)]),
        st.floats(big, F32_MAX, width=32),
        st.floats(-F32_MAX, -big, width=32),
    )
    subnormal = st.floats(-tiny, tiny, width=32, allow_subnormal=True)
    anything = st.floats(width=32, allow_nan=False, allow_infinity=False)
    constant = sizes.flatmap(
        lambda n: st.floats(-1e3, 1e3, width=32).map(lambda v: np.full(n, v, np.float32))
    )
    return st.one_of(
        _rows(sizes, ties),
        _with_a_finite_value(_rows(sizes, neg_inf)),
        _rows(sizes, huge | ties),
        _rows(sizes, subnormal),
        _rows(tiny_sizes, anything),
        constant,
    )


def logits_rows(
    vocab_size: int | None = None,
    *,
    min_vocab: int = 1,
    max_vocab: int = 256,
    adversarial: bool = True,
) -> st.SearchStrategy[Row]:
    """Finite rows, mixed with `adversarial_logits` unless ``adversarial`` is False."""
    finite = finite_logits(vocab_size, min_vocab=min_vocab, max_vocab=max_vocab)
    if not adversarial:
        return finite
    return st.one_of(
        finite, adversarial_logits(vocab_size, min_vocab=min_vocab, max_vocab=max_vocab)
    )


def token_histories(
    vocab_size: int, *, min_len: int = 0, max_len: int = 32
) -> st.SearchStrategy[list[int]]:
    """Token id lists in ``0..vocab_size``; some are a repeated pattern, as real text often is."""
    if vocab_size < 1 or not 0 <= min_len <= max_len:
        raise ValueError(
            f"need vocab_size >= 1 and 0 <= min_len <= max_len, got {vocab_size}, "
            f"{min_len}, {max_len}"
        )
    token = st.integers(0, vocab_size - 1)
    plain = st.lists(token, min_size=min_len, max_size=max_len)

    @st.composite
    def repeated(draw: st.DrawFn) -> list[int]:
        pattern = draw(st.lists(token, min_size=1, max_size=4))
        n = draw(st.integers(min_len, max_len))
        return (pattern * (n // len(pattern) + 1))[:n]

    return st.one_of(plain, repeated())


def _or_default(default: object, other: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return st.one_of(st.just(default), other)


KNOB_TABLE: tuple[dict[str, Any], ...] = _core.SAMPLER_KNOBS
"""The core's knob table (``rust/sampling/knobs.rs``): the strategies draw every knob from
its ``probe`` range, so a new knob is drawn without an edit here."""

_STAGE_KNOBS: dict[str, tuple[str, ...]] = {}
for _stage in _core.SAMPLER_STAGES:
    for _name in _stage["knobs"]:
        _STAGE_KNOBS.setdefault(_name, ())
        _STAGE_KNOBS[_name] += tuple(_stage["knobs"])

#: The knobs that make a chain draw at random rather than take the argmax.
_DRAWING = ("temperature", "dynamic_temp", "mirostat")


def _f32_knob(lo: float, hi: float) -> st.SearchStrategy[float]:
    # float32 values, which the chain holds exactly (a reference in float64 then sees
    # the same knob the chain does); tiny ones mean "off" (see `_flush`).
    return _knob(lo, hi).map(lambda x: _flush(_f32(x)))


def knob_values(knob: dict[str, Any], vocab: int) -> st.SearchStrategy[object]:
    """Values of one knob of `KNOB_TABLE`, from its ``probe`` range, ids inside ``vocab``.

    Drawn by the knob's kind; a kind with no strategy here fails loudly, so that a new
    kind of knob is not silently left at its default.
    """
    lo, hi = knob["probe"]
    kind = knob["kind"]
    token = st.integers(0, vocab - 1)
    if kind == "float":
        return _f32_knob(lo, hi)
    if kind in ("int", "int | None"):
        return st.integers(int(lo), int(hi))
    if kind == "mode":
        return st.integers(int(lo), int(hi)).map(MirostatMode)
    if kind == "pair | None":
        return st.tuples(_f32_knob(lo, hi), _f32_knob(lo, hi)).map(lambda p: tuple(sorted(p)))
    if kind == "tokens":
        return st.lists(token, max_size=3).map(tuple)
    if kind == "seed":
        return st.integers(0, 2**64 - 1)
    if kind == "bias":
        # Never ban the whole vocabulary: at most vocab - 1 entries.
        bias = st.one_of(_f32_knob(lo, hi), st.just(-math.inf))
        return st.dictionaries(token, bias, max_size=min(8, vocab - 1))
    raise AssertionError(f"knob {knob['name']}: no strategy for its kind {kind!r}")


def _refused_field(e: InvalidOptionError) -> str:
    return str(e).split(":", 1)[0]


def valid_options(kw: dict[str, Any], keep: Collection[str] = ()) -> SampleOpts:
    """`SampleOpts` from drawn knob values, reset to defaults where the core refuses them.

    The core's validator (and a chain under every preset) names the knob it refuses; that
    knob goes back to its default, or, if it already is, every knob of the stages that read
    it. So the rules between knobs (dynamic temperature replaces temperature, XTC's
    threshold, a ``min_keep`` no stage reads) are the core's, not restated here. Knobs in
    ``keep`` are never reset. Options a preset refuses only as an order (llama.cpp's
    mirostat chain with other stages set) are kept: they are valid options.
    """
    kw = dict(kw)
    defaults = _defaults()
    for _ in range(2 * len(KNOB_TABLE)):
        try:
            opts = SampleOpts(**kw)
            for order in ORDER_PRESETS:
                try:
                    opts.into_chain(order=order)
                except InvalidOptionError as e:
                    if _refused_field(e) != "order":
                        raise
            return opts
        except InvalidOptionError as e:
            field = _refused_field(e)
            if field not in defaults:
                raise
            if field not in keep and kw.get(field, defaults[field]) != defaults[field]:
                kw[field] = defaults[field]
            else:
                for name in _STAGE_KNOBS.get(field, ()):
                    if name not in keep:
                        kw[name] = defaults[name]
                if field in keep or not _STAGE_KNOBS.get(field):
                    break
    return SampleOpts(**{k: v for k, v in kw.items() if k in keep})


def _defaults() -> dict[str, Any]:
    # SampleOpts' own defaults (the table's are the float32 the chain holds: 0.1 is not).
    plain = SampleOpts()
    return {k["name"]: getattr(plain, k["name"]) for k in KNOB_TABLE}


@st.composite
def _sample_opts(
    draw: st.DrawFn, vocab_size: int | None, greedy: bool | None, off: frozenset[str]
) -> SampleOpts:
    vocab = vocab_size if vocab_size is not None else 1024
    defaults = _defaults()
    kw: dict[str, Any] = {}
    for knob in KNOB_TABLE:
        name = knob["name"]
        if name in off or (greedy is True and name in _DRAWING):
            continue
        if greedy is False and name == "temperature":
            kw[name] = draw(knob_values(knob, vocab))  # its probe range starts above 0
        elif greedy is False and name == "dynamic_temp":
            continue  # it replaces temperature, which sampling options set
        else:
            kw[name] = draw(_or_default(defaults[name], knob_values(knob, vocab)))
    keep = ("temperature",) if greedy is False else ()
    return valid_options(kw, keep)


def sample_opts(
    vocab_size: int | None = None,
    *,
    greedy: bool | None = None,
    knobs_off: Collection[str] = (),
) -> st.SearchStrategy[SampleOpts]:
    """Valid `SampleOpts`, with token ids (logit bias, DRY breakers) inside ``vocab_size``.

    ``greedy=True`` draws only greedy options, ``False`` only sampling ones (temperature > 0),
    None either. Each knob is at its default about half the time, and otherwise drawn from
    the core's table (`KNOB_TABLE`, each knob's ``probe`` range), float32 numbers as the
    chain holds them; knobs named in ``knobs_off`` stay at their defaults.
    """
    if vocab_size is not None and vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    names = {k["name"] for k in KNOB_TABLE}
    unknown = sorted(set(knobs_off) - names)
    if unknown:
        raise ValueError(f"knobs_off names no knob: {unknown}")
    return _sample_opts(vocab_size, greedy, frozenset(knobs_off))
