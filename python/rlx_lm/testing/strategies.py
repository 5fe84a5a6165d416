"""Hypothesis strategies for property tests of runners and samplers.

* `finite_logits`, `adversarial_logits`, `logits_rows`: float32 rows, plain or nasty
  (ties, ``-inf``, magnitudes near float32's limits, subnormals, one- and two-token
  vocabularies). Every row has at least one finite value.
* `token_histories`: token id lists within a vocabulary, with repeats so that
  penalties and DRY have something to find.
* `sample_opts`: valid `rlx_lm.SampleOpts`, each stage mostly at its default so that
  failures shrink to the stage responsible.

Importing this module needs hypothesis (``pip install 'rlx-lm[testing]'``).
"""

from __future__ import annotations

import math

from rlx_lm.testing.options import require_hypothesis

require_hypothesis()

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

from rlx_lm.sample_opts import MirostatMode, SampleOpts  # noqa: E402

__all__ = [
    "adversarial_logits",
    "finite_logits",
    "logits_rows",
    "sample_opts",
    "token_histories",
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


@st.composite
def _sample_opts(draw: st.DrawFn, vocab_size: int | None, greedy: bool | None) -> SampleOpts:
    vocab = vocab_size if vocab_size is not None else 1024
    token = st.integers(0, vocab - 1)
    unit = _knob(0.0, 1.0)
    kw: dict[str, object] = {}

    if greedy is True:
        kw["temperature"] = 0.0
    elif greedy is False:
        kw["temperature"] = draw(st.floats(0.05, 2.0))
    else:
        kw["temperature"] = draw(_or_default(0.0, st.floats(0.05, 2.0)))
    if greedy is not True and kw["temperature"] == 0.0 and draw(st.booleans()):
        lo = draw(_knob(0.0, 2.0))
        kw["dynamic_temp"] = (lo, draw(_knob(lo, 2.0)))
        kw["dynamic_temp_exponent"] = draw(_knob(0.0, 2.0))
    if greedy is not True:
        kw["mirostat"] = mode = draw(st.sampled_from(list(MirostatMode)))
        if mode != MirostatMode.OFF:
            kw["mirostat_tau"] = draw(_knob(0.0, 10.0))
            kw["mirostat_eta"] = draw(_knob(0.0, 1.0))
            kw["mirostat_m"] = draw(st.integers(2, 200))

    kw["top_k"] = draw(_or_default(None, st.integers(0, vocab)))
    kw["top_p"] = draw(_or_default(1.0, st.floats(0.01, 1.0)))
    kw["min_p"] = draw(_or_default(0.0, unit))
    kw["typical_p"] = draw(_or_default(1.0, st.floats(0.01, 1.0)))
    kw["top_n_sigma"] = draw(_or_default(0.0, _knob(0.0, 3.0)))
    xtc_prob: float = draw(st.one_of(st.just(0.0), unit))
    kw["xtc_prob"] = xtc_prob
    kw["xtc_threshold"] = draw(
        st.floats(0.01, 1.0) if xtc_prob > 0 else _or_default(0.0, st.floats(0.01, 1.0))
    )
    kw["repetition_penalty"] = draw(_or_default(1.0, st.floats(0.5, 2.0)))
    kw["frequency_penalty"] = draw(_or_default(0.0, _knob(-2.0, 2.0)))
    kw["presence_penalty"] = draw(_or_default(0.0, _knob(-2.0, 2.0)))
    kw["repetition_window"] = draw(_or_default(None, st.integers(1, 128) | st.just(-1)))
    kw["dry_multiplier"] = draw(_or_default(0.0, _knob(0.0, 2.0)))
    kw["dry_base"] = draw(_or_default(1.75, st.floats(1.0, 3.0)))
    kw["dry_allowed_length"] = draw(_or_default(2, st.integers(1, 4)))
    kw["dry_max_ngram"] = draw(_or_default(32, st.integers(0, 32)))
    kw["dry_sequence_breakers"] = draw(_or_default((), st.lists(token, max_size=3).map(tuple)))
    # min_keep only where a stage of every order reads it (llama.cpp's top-k does not).
    reads_min_keep = (
        kw["top_p"] != 1.0 or kw["min_p"] != 0.0 or kw["typical_p"] != 1.0 or xtc_prob > 0
    )
    kw["min_keep"] = draw(_or_default(1, st.integers(1, 4))) if reads_min_keep else 1
    kw["seed"] = draw(_or_default(None, st.integers(0, 2**64 - 1)))
    # Never ban the whole vocabulary: at most vocab - 1 entries.
    bias = st.one_of(_knob(-10.0, 10.0), st.just(-math.inf))
    kw["logit_bias"] = draw(st.dictionaries(token, bias, max_size=min(8, vocab - 1)))
    return SampleOpts(**kw)  # type: ignore[arg-type]


def sample_opts(
    vocab_size: int | None = None, *, greedy: bool | None = None
) -> st.SearchStrategy[SampleOpts]:
    """Valid `SampleOpts`, with token ids (logit bias, DRY breakers) inside ``vocab_size``.

    ``greedy=True`` draws only greedy options, ``False`` only sampling ones (temperature > 0),
    None either. Each knob is at its default about half the time.
    """
    if vocab_size is not None and vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    return _sample_opts(vocab_size, greedy)
