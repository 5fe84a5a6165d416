"""Optional: llama.cpp's sampler chain against ours on the same rows, as ratios (same run).

Needs ``llama-cpp-python`` (built from source; not a dependency); without it pytest skips this
module and the script prints one line and exits 0.
Run the table:   python benches/bench_llama_cpp_sampling.py [vocab ...]   (needs a release build)
As a smoke test: make check runs each llama.cpp chain once and checks it agrees with ours

Rows, history and scenarios are bench_sampling.py's. For each scenario the llama.cpp chain is
built with llama-cpp-python's low-level API from the same ``SampleOpts``, in llama.cpp's default
order (penalties, dry, top-k, top-p, min-p, temperature, then dist or greedy); our chain runs with
``order="llama.cpp"`` so both compute the same stages in the same order. llama.cpp samples from a
``llama_token_data_array`` of V (id, logit, p) entries that ``llama_sampler_sample`` refills from
the logits every token, so its time here is fill + apply; the fill alone (a numpy copy of an
(id, 0, 0) template, then the logits into the strided field) is timed too, and "apply" is the
difference. The penalties and DRY samplers keep their own ring buffer: it is fed the same
4096-token history with ``llama_sampler_accept`` before timing. DRY needs a vocabulary pointer:
a vocab-only GGUF from bench_llama_cpp.py's ``write_model`` provides it (no breakers are used).
"""

from __future__ import annotations

import ctypes
import logging
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bench_llama_cpp import write_model
from bench_sampling import SCENARIOS, VOCABS, best_of, history, lm_row

from rlx_lm import SampleOpts, SamplerChain

if __name__ == "__main__":
    try:
        import llama_cpp
    except ImportError as exc:
        print(f"llama-cpp-python is not importable ({exc}): no llama.cpp sampler figures")
        sys.exit(0)
else:
    llama_cpp = pytest.importorskip("llama_cpp")

# llama-cpp-python routes llama.cpp's log through this logger; it prints everything by default.
logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)

# llama_token_data is three 4-byte words (id, logit, p): numpy fills the candidate array in place.
assert ctypes.sizeof(llama_cpp.llama_token_data) == 12

SEED = 1


@contextmanager
def llama_vocab(vocab: int) -> Iterator[Any]:
    """A llama.cpp vocabulary pointer of ``vocab`` tokens (from a vocab-only GGUF load)."""
    with tempfile.TemporaryDirectory() as d:
        path = write_model(
            Path(d) / "vocab.gguf",
            hidden=8,
            layers=1,
            heads=1,
            kv_heads=1,
            inter=8,
            vocab=vocab,
            ctx=64,
        )
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        try:
            yield llama_cpp.llama_model_get_vocab(model)
        finally:
            llama_cpp.llama_model_free(model)


class LlamaChain:
    """llama.cpp's sampler chain for one ``SampleOpts``, over one reusable candidate array."""

    def __init__(self, opts: SampleOpts, vocab_ptr: Any, n_vocab: int, hist: np.ndarray) -> None:
        lc = llama_cpp
        unsupported = {
            "dynamic_temp": opts.dynamic_temp is not None,
            "typical_p": opts.typical_p < 1,
            "top_n_sigma": opts.top_n_sigma > 0,
            "xtc": opts.xtc_prob > 0,
            "mirostat": opts.mirostat != 0,
            "logit_bias": bool(opts.logit_bias),
            "dry_sequence_breakers": bool(opts.dry_sequence_breakers),
        }
        if any(unsupported.values()):
            raise ValueError(f"not mapped to llama.cpp here: {unsupported}")
        params = lc.llama_sampler_chain_default_params()
        params.no_perf = True
        self.chain = lc.llama_sampler_chain_init(params)
        stages: list[Any] = []
        penalised = opts.repetition_penalty != 1 or opts.frequency_penalty or opts.presence_penalty
        if penalised:
            window = len(hist) if opts.repetition_window == -1 else opts.repetition_window
            stages.append(
                lc.llama_sampler_init_penalties(
                    n_vocab,
                    window,
                    opts.repetition_penalty,
                    opts.frequency_penalty,
                    opts.presence_penalty,
                )
            )
        if opts.dry_multiplier > 0:
            # Our DRY looks at the whole history passed in; llama.cpp's at its last_n window.
            stages.append(
                lc.llama_sampler_init_dry(
                    vocab_ptr,
                    opts.dry_multiplier,
                    opts.dry_base,
                    opts.dry_allowed_length,
                    len(hist),
                    None,
                    0,
                )
            )
        if opts.top_k:
            stages.append(lc.llama_sampler_init_top_k(opts.top_k))
        if opts.top_p < 1:
            stages.append(lc.llama_sampler_init_top_p(opts.top_p, opts.min_keep))
        if opts.min_p > 0:
            stages.append(lc.llama_sampler_init_min_p(opts.min_p, opts.min_keep))
        if opts.is_greedy():
            stages.append(lc.llama_sampler_init_greedy())
        else:
            stages.append(lc.llama_sampler_init_temp(opts.temperature))
            stages.append(lc.llama_sampler_init_dist(SEED))
        for s in stages:
            lc.llama_sampler_chain_add(self.chain, s)  # the chain owns them from here
        for tok in hist:
            lc.llama_sampler_accept(self.chain, int(tok))
        self.names = [lc.llama_sampler_name(s).decode() for s in stages]
        self.n_vocab = n_vocab
        # The candidate array as flat float32 words (id, logit, p): a contiguous copy of an
        # (id, 0, 0) template, then the logits into every third word. (A structured-dtype copy
        # would take numpy's slow per-field path.)
        words = np.zeros(3 * n_vocab, np.float32)
        words.view(np.int32)[0::3] = np.arange(n_vocab, dtype=np.int32)
        self.template = words
        self.buf = np.zeros(3 * n_vocab, np.float32)
        self.logits = self.buf[1::3]
        self.ptr = ctypes.cast(self.buf.ctypes.data, lc.llama_token_data_p)
        self.cur = lc.llama_token_data_array(self.ptr, n_vocab, -1, False)
        self.cur_ref = ctypes.byref(self.cur)

    def fill(self, row: np.ndarray) -> None:
        """What llama_sampler_sample does before the chain: V fresh (id, logit, 0) entries."""
        np.copyto(self.buf, self.template)
        np.copyto(self.logits, row)
        cur = self.cur
        # Samplers may have pointed it at their own buffer (setattr: llama_cpp's
        # stubs type `data` as an array, the pointer is what it holds).
        setattr(cur, "data", self.ptr)  # noqa: B010
        cur.size = self.n_vocab
        cur.selected = -1
        cur.sorted = False

    def sample(self, row: np.ndarray) -> int:
        """Fill the candidate array from ``row``, run the chain, return the chosen token id."""
        self.fill(row)
        llama_cpp.llama_sampler_apply(self.chain, self.cur_ref)
        return int(self.cur.data[self.cur.selected].id)

    def close(self) -> None:
        llama_cpp.llama_sampler_free(self.chain)


def opts_for(name: str) -> SampleOpts:
    return SampleOpts(seed=SEED, **SCENARIOS[name])


def ours_for(opts: SampleOpts) -> SamplerChain:
    return opts.into_chain(order="llama.cpp")


def timed(fns: dict[str, Callable[[], object]], repeat: int = 15) -> dict[str, float]:
    """Seconds per call of each function: best of ``repeat`` batches, interleaved as in ratio."""
    numbers = {k: max(3, int(0.02 / max(best_of(f, 3), 1e-7))) for k, f in fns.items()}
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for k, f in fns.items():
            best[k] = min(best[k], best_of(f, numbers[k]))
    return best


# --- smoke tests (make check) -------------------------------------------------------

SMOKE_VOCAB = 32000


def test_llama_cpp_chains_run_and_agree_with_ours() -> None:
    row = lm_row(SMOKE_VOCAB)
    assert np.sum(row == row.max()) == 1  # no tie at the top: argmax is one token
    hist = history(SMOKE_VOCAB)
    with llama_vocab(SMOKE_VOCAB) as vocab:
        for name in SCENARIOS:
            theirs = LlamaChain(opts_for(name), vocab, SMOKE_VOCAB, hist)
            try:
                assert 0 <= theirs.sample(row) < SMOKE_VOCAB
            finally:
                theirs.close()
        # Greedy and top-k 1 pick the argmax in both engines.
        for opts in (SampleOpts(), SampleOpts(temperature=0.8, top_k=1, seed=SEED)):
            theirs = LlamaChain(opts, vocab, SMOKE_VOCAB, hist[:0])
            try:
                assert theirs.sample(row) == ours_for(opts).sample(row) == int(np.argmax(row))
            finally:
                theirs.close()
        # Penalties and DRY as configured in the bench, each alone and together: both engines'
        # greedy picks agree on a row whose top token is the one they push down (it is in the
        # history, and it followed an earlier occurrence of the history's last three tokens).
        hist2 = hist.copy()
        hist2[-3:] = hist[100:103]
        pushed = int(hist[103])
        row2 = row.copy()
        row2[pushed] = row.max() + 0.5
        both = {**SCENARIOS["penalties+dry"], "temperature": 0.0}
        no_penalties = {
            "repetition_penalty": 1.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
        }
        for knobs in (both, {**both, "dry_multiplier": 0.0}, {**both, **no_penalties}):
            opts = SampleOpts(**knobs)
            theirs = LlamaChain(opts, vocab, SMOKE_VOCAB, hist2)
            try:
                pick = theirs.sample(row2)
            finally:
                theirs.close()
            assert pick != pushed, theirs.names
            assert pick == ours_for(opts).sample(row2, hist2), theirs.names


# --- the table --------------------------------------------------------------------


CASES = [(name, 2.2) for name in SCENARIOS] + [("top_p", 1.1)]


def measure(vocab: int, vocab_ptr: Any, name: str, shape: float) -> dict[str, float]:
    """Microseconds per call of np.argmax, our chain, llama.cpp's fill + apply and its fill."""
    row = lm_row(vocab, shape)
    opts = opts_for(name)
    ours = ours_for(opts)
    hist = history(vocab) if name == "penalties+dry" else None
    theirs = LlamaChain(opts, vocab_ptr, vocab, hist if hist is not None else np.empty(0, np.int64))
    try:
        t = timed(
            {
                "argmax": lambda: np.argmax(row),
                "ours": lambda: ours.sample(row, hist),
                "theirs": lambda: theirs.sample(row),
                "fill": lambda: theirs.fill(row),
            }
        )
    finally:
        theirs.close()
    return {k: v * 1e6 for k, v in t.items()}


def main(vocabs: tuple[int, ...] = VOCABS) -> int:
    import rlx_lm

    if rlx_lm.build_profile != "release":
        print("build a release extension first: maturin develop --release", file=sys.stderr)
        return 2
    results = {}
    for vocab in vocabs:
        with llama_vocab(vocab) as vocab_ptr:
            for name, shape in CASES:
                results[name, shape, vocab] = measure(vocab, vocab_ptr, name, shape)
    print(
        f"{'scenario':<16}{'vocab':>8}{'argmax us':>11}{'rlx_lm us':>11}{'llama.cpp us':>14}"
        f"{'= fill us':>11}{'+ apply us':>12}{'rlx/argmax':>12}{'llama/argmax':>14}"
        f"{'llama/rlx':>11}{'apply/rlx':>11}"
    )
    for name, shape in sorted(CASES, key=lambda c: list(SCENARIOS).index(c[0])):
        for vocab in vocabs:
            t = results[name, shape, vocab]
            a, o, th, f = t["argmax"], t["ours"], t["theirs"], t["fill"]
            label = name if shape == 2.2 else f"{name} (flat)"
            print(
                f"{label:<16}{vocab:>8}{a:>11.1f}{o:>11.1f}{th:>14.1f}{f:>11.1f}{th - f:>12.1f}"
                f"{o / a:>12.2f}{th / a:>14.2f}{th / o:>11.2f}{(th - f) / o:>11.2f}"
            )
    print(
        "llama.cpp: [penalties(last_n 4096) -> dry(last_n 4096, no breakers) ->] top-k -> top-p ->"
        " min-p -> temp -> dist(seed), or greedy alone; ours: order='llama.cpp' (temperature last,"
        " so on the flat row the untempered top-p 0.95 nucleus is ~40k of 151936 tokens).\n"
        "llama.cpp us = fill + apply; fill = numpy's refill of the candidate array (llama.cpp's"
        " own is one C++ loop); apply = the difference. Ours caps DRY repeats at dry_max_ngram 32,"
        " llama.cpp does not (same cost here)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(tuple(int(v) for v in sys.argv[1:]) or VOCABS))
