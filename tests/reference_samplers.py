"""A plain numpy/Python reference of every sampler stage, for differential tests.

Slow and obvious on purpose: candidates are a dict ``token -> logit`` (float64),
every stage is written straight from its formula in docs/samplers.md, and ties
always go to the lowest token id. Each stage returns the surviving candidates;
``margin`` helpers report how close a decision came to flipping, so tests can
skip inputs where float32 and float64 rounding may legitimately disagree.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

Cands = dict[int, float]


def from_row(row: np.ndarray) -> Cands:
    """Every finite logit of a row as a candidate."""
    return {i: float(v) for i, v in enumerate(row) if math.isfinite(v)}


def ranked(c: Cands) -> list[int]:
    """Tokens by descending logit, ties by ascending id."""
    return sorted(c, key=lambda t: (-c[t], t))


def probs(c: Cands) -> dict[int, float]:
    """Softmax of the candidates."""
    m = max(c.values())
    e = {t: math.exp(v - m) for t, v in c.items()}
    s = sum(e.values())
    return {t: v / s for t, v in e.items()}


def log_probs(c: Cands) -> dict[int, float]:
    """Log-softmax of the candidates."""
    m = max(c.values())
    lse = m + math.log(sum(math.exp(v - m) for v in c.values()))
    return {t: v - lse for t, v in c.items()}


# --- logit edits -------------------------------------------------------------


def logit_bias(c: Cands, bias: dict[int, float]) -> Cands:
    out = {t: v + bias.get(t, 0.0) for t, v in c.items()}
    return {t: v for t, v in out.items() if v != -math.inf}


def penalize(v: float, count: int, repeat: float, freq: float, presence: float) -> float:
    if count == 0:
        return v
    v = v * repeat if v <= 0 else v / repeat
    return v - count * freq - presence


def penalties(
    c: Cands,
    history: Sequence[int],
    repeat: float,
    freq: float,
    presence: float,
    window: int | None,
    order: str = "default",
    prompt_len: int = 0,
) -> Cands:
    """``window`` None is the order's default: the last 64 (default, llama.cpp) or all (hf, vllm).

    Under vLLM the repetition penalty sees prompt and output, frequency and presence the output
    (the history after ``prompt_len``) only.
    """
    if window is None:
        window = -1 if order in ("hf", "vllm") else 64
    h = list(history)
    start = 0 if window == -1 else max(len(h) - window, 0)
    recent = h[start:]
    counts = Counter(recent)
    if order != "vllm" or prompt_len == 0:
        return {t: penalize(v, counts[t], repeat, freq, presence) for t, v in c.items()}
    out_counts = Counter(h[max(start, prompt_len) :])
    result = {}
    for t, v in c.items():
        if counts[t] == 0:
            result[t] = v
            continue
        w = v * repeat if v <= 0 else v / repeat
        if out_counts[t]:
            w -= out_counts[t] * freq + presence
        result[t] = w
    return result


def dry_lengths(
    history: Sequence[int], allowed: int, max_ngram: int, breakers: Sequence[int]
) -> dict[int, int]:
    """Brute force: for each token, the longest repeat of the history's end it would extend."""
    h = list(history)
    n = len(h)
    out: dict[int, int] = {}
    if n < 2 or n <= allowed:
        return out
    rep_limit = n
    for i in range(n):
        if h[n - 1 - i] in breakers:
            rep_limit = i
            break
    if rep_limit < allowed or rep_limit == 0:
        return out
    cap = min(rep_limit, max_ngram) if max_ngram > 0 else rep_limit
    for j in range(n - 1):
        best = 0
        for k in range(1, cap + 1):
            if j - k + 1 < 0:
                break
            if h[j - k + 1 : j + 1] == h[n - k : n]:
                best = k
        if best >= allowed and h[j + 1] not in breakers:
            t = h[j + 1]
            out[t] = max(out.get(t, 0), best)
    return out


def dry_penalty(length: int, multiplier: float, base: float, allowed: int) -> float:
    e = float(length - allowed)
    if base > 1.000001:
        # llama.cpp's clamp, in its float32 arithmetic: int(88.7228391f / logf(base)).
        e = min(e, int(np.float32(88.7228391) / np.log(np.float32(base))))
    # In float64 (llama.cpp's std::pow(float, int)), then rounded to float32.
    v = multiplier * base**e
    return float(np.float32(v)) if v <= float(np.finfo(np.float32).max) else math.inf


def dry(
    c: Cands,
    history: Sequence[int],
    multiplier: float,
    base: float,
    allowed: int,
    max_ngram: int,
    breakers: Sequence[int],
) -> Cands:
    lens = dry_lengths(history, allowed, max_ngram, breakers)
    return {
        t: v - (dry_penalty(lens[t], multiplier, base, allowed) if t in lens else 0.0)
        for t, v in c.items()
    }


# --- temperature -------------------------------------------------------------


def temperature(c: Cands, t: float) -> Cands:
    if t <= 0:
        best = ranked(c)[0]
        return {best: c[best]}
    return {k: v / t for k, v in c.items()}


def entropy(c: Cands, floor: float = 0.0) -> float:
    """Entropy in nats; probabilities at or below ``floor`` count as zero (``floor`` set
    to float32's underflow gives the entropy a float32 softmax can see)."""
    return -sum(p * math.log(p) for p in probs(c).values() if p > floor)


def dynamic_temperature(
    c: Cands, lo: float, hi: float, exponent: float, floor: float = 0.0
) -> tuple[Cands, float]:
    if len(c) <= 1:
        return c, math.nan
    norm = min(max(entropy(c, floor) / math.log(len(c)), 0.0), 1.0)
    t = lo + (hi - lo) * norm**exponent
    return temperature(c, t), t


# --- truncation --------------------------------------------------------------


def top_k(c: Cands, k: int, keep_ties: bool = False) -> Cands:
    if k <= 0 or k >= len(c):
        return dict(c)
    order = ranked(c)
    keep = order[:k]
    if keep_ties:
        kth = c[order[k - 1]]
        keep = [t for t in order if c[t] >= kth]
    return {t: c[t] for t in keep}


def top_k_margin(c: Cands, k: int, edited: set[int]) -> float:
    """How close an edited logit comes to the k-th (ties of untouched logits are exact)."""
    if k <= 0 or k >= len(c):
        return math.inf
    kth = ranked(c)[k - 1]
    vk = c[kth]
    gaps = [abs(v - vk) for t, v in c.items() if t != kth and (t in edited or kth in edited)]
    return min(gaps, default=math.inf)


def top_p(c: Cands, p: float, min_keep: int = 1) -> tuple[Cands, float]:
    """Survivors and how close the cut came to flipping: the smallest distance |cum - p|
    over the decisions made, and the gap between the last logit kept and the first one
    dropped (unequal logits that float32 may tie, e.g. after a huge temperature
    underflows them, are ranked by the tie-break instead; equal ones rank by id in both)."""
    if p >= 1:
        return dict(c), math.inf
    pr = probs(c)
    cum = 0.0
    margin = math.inf
    order = ranked(c)
    for i, t in enumerate(order):
        cum += pr[t]
        margin = min(margin, abs(cum - p))
        if cum >= p and i + 1 >= min_keep:
            if i + 1 < len(order) and c[t] != c[order[i + 1]]:
                margin = min(margin, c[t] - c[order[i + 1]])
            return {u: c[u] for u in order[: i + 1]}, margin
    return dict(c), margin


def min_p(c: Cands, p: float, min_keep: int = 1) -> tuple[Cands, float]:
    if p <= 0:
        return dict(c), math.inf
    thr = max(c.values()) + math.log(p)
    margin = min(abs(v - thr) for v in c.values())
    kept = {t: v for t, v in c.items() if v >= thr}
    if len(kept) < min_keep:
        return top_k(c, min_keep), margin
    return kept, margin


def typical(
    c: Cands, p: float, min_keep: int = 1, inclusive: bool = False, hf: bool = False
) -> tuple[Cands, float]:
    """llama.cpp's typical; ``hf``: Hugging Face's (``>= p``, ties kept, min_keep after)."""
    if p >= 1 or len(c) <= 1:
        return dict(c), math.inf
    lp = log_probs(c)
    h = -sum(math.exp(v) * v for v in lp.values() if math.exp(v) > 0)
    score = {t: abs(-lp[t] - h) for t in c}
    order = sorted(c, key=lambda t: (score[t], t))
    gaps = [abs(score[a] - score[b]) for a, b in itertools.pairwise(order) if c[a] != c[b]]
    cum = 0.0
    margin = min(gaps, default=math.inf)
    for i, t in enumerate(order):
        cum += math.exp(lp[t])
        margin = min(margin, abs(cum - p))
        reached = cum >= p if inclusive else cum > p
        if hf and (reached or i + 1 == len(order)):
            kept = [u for u in order if score[u] <= score[t]]
            if len(kept) < min_keep:
                kept = order[:min_keep]
            return {u: c[u] for u in kept}, margin
        if reached and i + 1 >= min_keep:
            return {u: c[u] for u in order[: i + 1]}, margin
    return dict(c), margin


def top_n_sigma(c: Cands, n: float) -> tuple[Cands, float]:
    if n <= 0 or len(c) <= 1:
        return dict(c), math.inf
    # Over the finite logits only, as the chain does: a penalty that overflowed to
    # -inf would make the mean -inf and the threshold NaN.
    vals = np.array([v for v in c.values() if math.isfinite(v)], dtype=np.float64)
    if vals.size <= 1:
        return dict(c), math.inf
    thr = float(vals.max() - n * vals.std())
    margin = float(np.min(np.abs(vals - thr)))
    return {t: v for t, v in c.items() if v >= thr}, margin


def xtc(c: Cands, threshold: float, prob: float, min_keep: int, coin: float) -> tuple[Cands, float]:
    if prob <= 0 or coin > prob or len(c) < 2:
        return dict(c), math.inf
    pr = probs(c)
    order = ranked(c)
    margin = min(abs(pr[t] - threshold) for t in order)
    above = [t for t in order if pr[t] >= threshold]
    if len(above) < 2 or len(c) - (len(above) - 1) < min_keep:
        return dict(c), margin
    drop = set(above[:-1])
    return {t: v for t, v in c.items() if t not in drop}, margin


# --- draw and generator ------------------------------------------------------


def uniform(seed: int, sequence: int, step: int, stream: int) -> float:
    """Philox4x64-10 of counter [step, sequence, 0, 0], key [seed, 0], word ``stream``."""
    counter = (step + (sequence << 64) - 1) % (1 << 256)
    words = [(counter >> (64 * i)) & (2**64 - 1) for i in range(4)]
    bg = np.random.Philox(
        counter=np.array(words, dtype=np.uint64), key=np.array([seed, 0], dtype=np.uint64)
    )
    raw = bg.random_raw(4)
    return float(int(raw[stream]) >> 11) * 2.0**-53


def draw(c: Cands, u: float) -> tuple[int, float]:
    """Inverse CDF over ascending token ids; also the distance of u to a CDF edge."""
    pr = probs(c)
    cum = 0.0
    margin = math.inf
    ids = sorted(c)
    for t in ids:
        if pr[t] <= 0:
            continue
        cum += pr[t]
        margin = min(margin, abs(cum - u))
        if cum > u:
            return t, margin
    return ids[-1], margin


# --- mirostat ----------------------------------------------------------------


def mirostat_v1_k(c: Cands, mu: float, m: int, vocab: int) -> float:
    lp = log_probs(c)
    order = ranked(c)[:m]
    num = den = 0.0
    for i in range(len(order) - 1):
        t = math.log((i + 2) / (i + 1))
        b = lp[order[i]] - lp[order[i + 1]]
        num += t * b
        den += t * t
    if den == 0:
        return 1.0
    s_hat = num / den
    if s_hat <= 0:
        return math.inf  # a flat head: keep everything
    eps = s_hat - 1
    ratio = 1 / math.log(vocab) if abs(eps) < 1e-9 else eps / (1 - vocab ** (-eps))
    return float((ratio * 2**mu) ** (1 / s_hat))


def mirostat_v2(c: Cands, mu: float) -> Cands:
    lp = log_probs(c)
    kept = {t: v for t, v in c.items() if -lp[t] / math.log(2) <= mu}
    if not kept:
        best = ranked(c)[0]
        kept = {best: c[best]}
    return kept


def surprise_bits(c: Cands, token: int) -> float:
    return -log_probs(c)[token] / math.log(2)


# --- whole chains ------------------------------------------------------------

DEFAULT_ORDER = [
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
]
PRESETS: dict[str, tuple[list[str], bool, bool]] = {
    # name: (order, top-k keeps ties, Hugging Face's typical and top-k min_keep)
    "default": (DEFAULT_ORDER, False, False),
    "llama.cpp": (
        [
            "logit_bias",
            "penalties",
            "dry",
            "top_n_sigma",
            "top_k",
            "typical",
            "top_p",
            "min_p",
            "xtc",
            "temperature",
        ],
        False,
        False,
    ),
    "hf": (
        [
            "logit_bias",
            "penalties",
            "dry",
            "temperature",
            "top_k",
            "top_p",
            "min_p",
            "typical",
            "top_n_sigma",
            "xtc",
        ],
        True,
        True,
    ),
    "vllm": (
        [
            "logit_bias",
            "penalties",
            "dry",
            "temperature",
            "min_p",
            "top_k",
            "top_p",
            "typical",
            "top_n_sigma",
            "xtc",
        ],
        True,
        False,
    ),
}


def _edited(before: float, after: float, o: object) -> bool:
    """Whether a logit changed by more than a temperature's scaling."""
    t = o.temperature  # type: ignore[attr-defined]
    if o.dynamic_temp is not None:  # type: ignore[attr-defined]
        return True
    return not (after == before or (t > 0 and after == before / t))


def cut_margin(before: Cands, after: Cands, edited: set[int]) -> float:
    """How close a kept and a dropped candidate were, where one of them was edited by an
    earlier stage: float32 may tie (or reorder) edited logits that float64 still tells
    apart, and then which of them a ranked cut keeps is the tie-break's business. Ties
    of untouched logits are exact in both and break alike."""
    dropped = [u for u in before if u not in after]
    # Every pair with an edited side: kept-and-edited against every dropped, and every
    # kept against dropped-and-edited (the pairs of the plain double loop, in n log n).
    return min(
        _closest([before[t] for t in after if t in edited], [before[u] for u in dropped]),
        _closest([before[t] for t in after], [before[u] for u in dropped if u in edited]),
    )


def _closest(a: list[float], b: list[float]) -> float:
    """``min |x - y|`` over ``x`` in ``a``, ``y`` in ``b`` (inf if either is empty); a pair
    of equal infinities has no gap to measure and is skipped, as the double loop's
    ``min`` skipped its NaN."""
    if not a or not b:
        return math.inf
    av, bs = np.asarray(a, np.float64), np.sort(np.asarray(b, np.float64))
    i = np.searchsorted(bs, av)
    near = np.concatenate([bs[np.clip(i - 1, 0, len(bs) - 1)], bs[np.clip(i, 0, len(bs) - 1)]])
    with np.errstate(invalid="ignore"):
        gaps = np.abs(np.concatenate([av, av]) - near)
    gaps = gaps[~np.isnan(gaps)]
    return float(gaps.min()) if gaps.size else math.inf


def edited_since(raw: Cands, c: Cands, o: object) -> set[int]:
    """The candidates an earlier stage changed by more than a temperature's scaling."""
    return {t for t in c if raw.get(t) is None or _edited(raw[t], c[t], o)}


@dataclass
class ChainRun:
    """What the reference chain did: survivors, token and the tightest margin."""

    final: Cands
    token: int
    margin: float
    edited: Cands = field(default_factory=dict)
    """The logits after the editing stages (bias, penalties, DRY), before any other."""
    temperature: float = math.nan
    """The dynamic temperature used (NaN without one)."""


def run_chain(
    opts: object,
    order: str,
    row: np.ndarray,
    history: Sequence[int],
    step: int = 0,
    entropy_floor: float = 0.0,
    float32_logits: bool = False,
) -> ChainRun:
    """The whole chain for ``SampleOpts``-like ``opts`` (no mirostat), at ``step`` of sequence 0.
    ``entropy_floor``: probabilities dynamic temperature's entropy ignores (see ``entropy``).
    ``float32_logits``: each stage that changes logits (bias, penalties, DRY, temperature)
    hands on float32 values, as the chain stores them, the rest still in float64: what the
    chain's decisions see where float32 ties what float64 orders."""
    o = opts
    names, keep_ties, inclusive = PRESETS[order]
    seed = int(o.seed)  # type: ignore[attr-defined]
    c = from_row(row)
    margin = math.inf
    raw = dict(c)
    after_edits: Cands = dict(c)
    dyn_t = math.nan

    def stored(c: Cands) -> Cands:
        if not float32_logits:
            return c
        with np.errstate(over="ignore"):  # past float32's range is +-inf, as in the chain
            return {t: float(np.float32(v)) for t, v in c.items()}

    for name in names:
        if name == "logit_bias":
            c = stored(logit_bias(c, dict(o.logit_bias)))  # type: ignore[attr-defined]
            after_edits = dict(c)
        elif name == "penalties":
            c = penalties(
                c,
                history,
                o.repetition_penalty,  # type: ignore[attr-defined]
                o.frequency_penalty,  # type: ignore[attr-defined]
                o.presence_penalty,  # type: ignore[attr-defined]
                o.repetition_window,  # type: ignore[attr-defined]
                order,
            )
            c = stored(c)
            after_edits = dict(c)
        elif name == "dry" and o.dry_multiplier > 0:  # type: ignore[attr-defined]
            c = dry(
                c,
                history,
                o.dry_multiplier,  # type: ignore[attr-defined]
                o.dry_base,  # type: ignore[attr-defined]
                o.dry_allowed_length,  # type: ignore[attr-defined]
                o.dry_max_ngram,  # type: ignore[attr-defined]
                o.dry_sequence_breakers,  # type: ignore[attr-defined]
            )
            c = stored(c)
            after_edits = dict(c)
        elif name == "temperature":
            if o.dynamic_temp is not None:  # type: ignore[attr-defined]
                lo, hi = o.dynamic_temp  # type: ignore[attr-defined]
                c, dyn_t = dynamic_temperature(
                    c,
                    lo,
                    hi,
                    o.dynamic_temp_exponent,  # type: ignore[attr-defined]
                    entropy_floor,
                )
                c = stored(c)
            else:
                before = c
                c = stored(temperature(c, o.temperature))  # type: ignore[attr-defined]
                if o.temperature <= 0:  # type: ignore[attr-defined]
                    # greedy: the argmax is a cut too
                    margin = min(margin, cut_margin(before, c, edited_since(raw, before, o)))
        elif name == "top_k" and o.top_k:  # type: ignore[attr-defined]
            edited = edited_since(raw, c, o)
            # The default order and Hugging Face keep at least min_keep.
            k = o.top_k  # type: ignore[attr-defined]
            if order in ("default", "hf"):
                k = max(k, o.min_keep)  # type: ignore[attr-defined]
            margin = min(margin, top_k_margin(c, k, edited))
            c = top_k(c, k, keep_ties)
        elif name == "typical":
            before = c
            c, m = typical(c, o.typical_p, o.min_keep, inclusive, hf=inclusive)  # type: ignore[attr-defined]
            margin = min(margin, m, cut_margin(before, c, edited_since(raw, before, o)))
        elif name == "top_p":
            before = c
            c, m = top_p(c, o.top_p, o.min_keep)  # type: ignore[attr-defined]
            margin = min(margin, m, cut_margin(before, c, edited_since(raw, before, o)))
        elif name == "min_p":
            before = c
            c, m = min_p(c, o.min_p, o.min_keep)  # type: ignore[attr-defined]
            margin = min(margin, m, cut_margin(before, c, edited_since(raw, before, o)))
        elif name == "top_n_sigma":
            c, m = top_n_sigma(c, o.top_n_sigma)  # type: ignore[attr-defined]
            margin = min(margin, m)
        elif name == "xtc":
            coin = uniform(seed, 0, step, 1)
            before = c
            c, m = xtc(c, o.xtc_threshold, o.xtc_prob, o.min_keep, coin)  # type: ignore[attr-defined]
            margin = min(margin, m, cut_margin(before, c, edited_since(raw, before, o)))
    token, m = draw(c, uniform(seed, 0, step, 0))
    return ChainRun(c, token, min(margin, m), after_edits, dyn_t)
