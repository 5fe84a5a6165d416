"""Optional: our decode tokens/s as a ratio of llama.cpp's on the same F32 GGUF (same run).

Needs ``llama-cpp-python`` (built from source; not a dependency). Writes a random-weight F32
llama GGUF with a byte-fallback SentencePiece vocabulary, decodes ``steps`` tokens after a
``ctx``-token prompt with both engines, and prints both rates and ours / theirs (goal >= 0.5).
Run ``python benches/bench_llama_cpp.py`` for the full-size figures (hidden 1024, 8 layers).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from rlx_lm.runners.llama import load_llama


def write_model(
    path: Path,
    *,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    inter: int,
    vocab: int,
    ctx: int,
    seed: int = 0,
) -> Path:
    """A random F32 llama GGUF that llama.cpp accepts (SentencePiece vocab with byte tokens)."""
    rng = np.random.default_rng(seed)
    hd = hidden // heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(hd)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    specials = ["<unk>", "<s>", "</s>"]
    pieces = [f"<0x{b:02X}>" for b in range(256)]
    filler = [f"\u2581t{i}" for i in range(vocab - len(specials) - len(pieces))]
    tokens = specials + pieces + filler
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(len(filler))])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(filler))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def mat(o: int, i: int) -> np.ndarray:
        w: np.ndarray = rng.standard_normal((o, i), dtype=np.float32) / np.float32(np.sqrt(i))
        return w

    ones = np.ones(hidden, dtype=np.float32)
    w.add_tensor("token_embd.weight", mat(vocab, hidden))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", mat(vocab, hidden))
    for b in range(layers):
        p = f"blk.{b}."
        w.add_tensor(p + "attn_norm.weight", ones)
        w.add_tensor(p + "ffn_norm.weight", ones)
        w.add_tensor(p + "attn_q.weight", mat(heads * hd, hidden))
        w.add_tensor(p + "attn_k.weight", mat(kv_heads * hd, hidden))
        w.add_tensor(p + "attn_v.weight", mat(kv_heads * hd, hidden))
        w.add_tensor(p + "attn_output.weight", mat(hidden, heads * hd))
        w.add_tensor(p + "ffn_gate.weight", mat(inter, hidden))
        w.add_tensor(p + "ffn_up.weight", mat(inter, hidden))
        w.add_tensor(p + "ffn_down.weight", mat(hidden, inter))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def compare(path: Path, *, ctx: int, steps: int, threads: int = 2) -> dict[str, float]:
    """Median decode step of both engines after the same ``ctx``-token prompt."""
    from llama_cpp import Llama

    ours = load_llama(path, max_seq=ctx + steps + 1, packed=False)
    # The same fixed tokens for both engines: a decode step costs the same whatever the token.
    ids = np.random.default_rng(5).integers(259, ours.vocab_size, ctx + steps)
    prompt, feed = [int(t) for t in ids[:ctx]], [int(t) for t in ids[ctx:]]
    ours.prefill_logits(prompt)
    times = []
    for tok in feed:
        t = time.perf_counter()
        ours.decode_logits(tok)
        times.append(time.perf_counter() - t)
    ours_step = statistics.median(times)

    llm = Llama(
        model_path=str(path),
        n_ctx=ctx + steps + 8,
        n_batch=min(512, ctx),
        n_threads=threads,
        verbose=False,
    )
    llm.eval(prompt)
    times = []
    for tok in feed:
        t = time.perf_counter()
        llm.eval([tok])
        times.append(time.perf_counter() - t)
    theirs_step = statistics.median(times)
    return {
        "ours_tok_s": 1.0 / ours_step,
        "llama_cpp_tok_s": 1.0 / theirs_step,
        "ours_over_llama_cpp": theirs_step / ours_step,
    }


def test_bench_llama_cpp_smoke(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    path = write_model(
        tmp_path / "m.gguf", hidden=64, layers=2, heads=4, kv_heads=2, inter=128, vocab=512, ctx=64
    )
    figures = compare(path, ctx=16, steps=3, threads=1)
    assert all(np.isfinite(v) and v > 0 for v in figures.values())


if __name__ == "__main__":
    ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    with tempfile.TemporaryDirectory() as d:
        model = write_model(
            Path(d) / "bench-f32.gguf",
            hidden=1024,
            layers=8,
            heads=16,
            kv_heads=4,
            inter=2816,
            vocab=32000,
            ctx=ctx + 64,
        )
        for key, value in compare(model, ctx=ctx, steps=20).items():
            print(f"{key:>22}: {value:.4g}")
