"""The tensors of a Llama-family model, gathered under llama.cpp's short names by either loader."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import numpy.typing as npt

from numpy_llama.linear import DenseMatrix, Matrix, PackedMatrix
from rlx_lm.errors import WeightFormatError
from rlx_lm.runners.llama_config import LlamaConfig

__all__ = ["LayerWeights", "LlamaWeights", "TensorGetter", "unpermute_rope_rows"]

F32 = npt.NDArray[np.float32]

#: ``get(name, kind)`` -> a matrix ("matrix"), a float32 vector ("vector"), or None if absent.
TensorGetter = Callable[[str, str], "Matrix | list[Matrix] | F32 | None"]


@dataclass
class LayerWeights:
    """One transformer block's weights (``[out, in]`` matrices, float32 vectors)."""

    attn_norm: F32 | None
    """None where the block has no norm before attention (OLMo 2)."""
    q: Matrix
    k: Matrix
    v: Matrix
    o: Matrix
    ffn_norm: F32 | None
    gate: Matrix | None
    """The dense MLP's matrices (a mixture's: its shared expert's, if it has one)."""
    up: Matrix | None
    down: Matrix | None
    q_bias: F32 | None = None
    k_bias: F32 | None = None
    v_bias: F32 | None = None
    q_norm: F32 | None = None
    k_norm: F32 | None = None
    attn_post_norm: F32 | None = None
    ffn_post_norm: F32 | None = None
    router: Matrix | None = None
    """A mixture of experts' router ``[n_experts, hidden]``."""
    experts: list[tuple[Matrix, Matrix, Matrix]] | None = None
    """A mixture's experts: (gate, up, down) each."""
    shared_gate: F32 | None = None
    """Qwen2-MoE: the shared expert's gate vector."""


@dataclass
class LlamaWeights:
    """All weights of a model: embedding, blocks, final norm and output head."""

    embed: Matrix
    layers: list[LayerWeights]
    norm: F32
    output: Matrix

    @property
    def nbytes(self) -> int:
        """Resident bytes of every weight (a tied head counted once)."""
        total = self.embed.nbytes + int(self.norm.nbytes)
        if self.output is not self.embed:
            total += self.output.nbytes
        for lw in self.layers:
            for m in (lw.q, lw.k, lw.v, lw.o, lw.gate, lw.up, lw.down):
                total += 0 if m is None else m.nbytes
            for trio in lw.experts or []:
                total += sum(m.nbytes for m in trio)
            for vec in (lw.attn_norm, lw.ffn_norm, lw.q_bias, lw.k_bias, lw.v_bias):
                total += 0 if vec is None else int(vec.nbytes)
        return total

    @classmethod
    def gather(
        cls,
        cfg: LlamaConfig,
        get: TensorGetter,
        *,
        where: str,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> LlamaWeights:
        """Collect and shape-check every tensor ``cfg`` needs from ``get`` (llama.cpp names).

        ``on_progress(done, total)`` is called after each block and after the head.
        """
        hd, h, f = cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
        q_out, kv_out = cfg.n_heads * hd, cfg.n_kv_heads * hd

        def matrix(name: str, shape: tuple[int, int]) -> Matrix:
            m = get(name, "matrix")
            if m is None or isinstance(m, np.ndarray):
                raise WeightFormatError(f"{where}: missing tensor {name}")
            if tuple(m.shape) != shape:
                raise WeightFormatError(
                    f"{where}: tensor {name} has shape {tuple(m.shape)}, expected {shape}"
                )
            return m

        def vector(name: str, n: int, *, required: bool = True) -> F32 | None:
            v = get(name, "vector")
            if v is None:
                if required:
                    raise WeightFormatError(f"{where}: missing tensor {name}")
                return None
            if not isinstance(v, np.ndarray) or v.shape != (n,):
                got = getattr(v, "shape", None)
                raise WeightFormatError(f"{where}: tensor {name} has shape {got}, expected ({n},)")
            return np.ascontiguousarray(v, dtype=np.float32)

        def must(v: F32 | None) -> F32:
            assert v is not None
            return v

        def parts(name: str, counts: list[int], cols: int) -> list[Matrix] | None:
            """A fused matrix (Phi-3's attn_qkv, its ffn_up of gate then up) cut into rows."""
            m = get(name, "matrix")
            if m is None or isinstance(m, np.ndarray):
                return None
            if tuple(m.shape) != (sum(counts), cols):
                raise WeightFormatError(
                    f"{where}: tensor {name} has shape {tuple(m.shape)}, "
                    f"expected {(sum(counts), cols)}"
                )
            bounds = np.cumsum([0, *counts])
            out: list[Matrix] = []
            for lo, hi in pairwise(bounds):
                if isinstance(m, DenseMatrix):
                    out.append(DenseMatrix(m.w[lo:hi]))
                else:
                    assert isinstance(m, PackedMatrix)
                    out.append(PackedMatrix(m.raw[lo:hi], m.qtype, (int(hi - lo), cols)))
            return out

        def experts(p: str) -> list[tuple[Matrix, Matrix, Matrix]]:
            """A block's experts: stacked (``ffn_gate_exps``) or one matrix each."""
            n, ff = cfg.n_experts, cfg.expert_ff
            out: list[list[Matrix]] = []
            for part, shape in (("gate", (ff, h)), ("up", (ff, h)), ("down", (h, ff))):
                stack = get(f"{p}ffn_{part}_exps", "stack")
                if stack is None:
                    out.append([matrix(f"{p}ffn_{part}.{e}", shape) for e in range(n)])
                    continue
                assert isinstance(stack, list)
                if len(stack) != n or any(tuple(m.shape) != shape for m in stack):
                    raise WeightFormatError(f"{where}: {p}ffn_{part}_exps has the wrong shape")
                out.append(stack)
            return list(zip(*out, strict=True))

        layers = []
        for i in range(cfg.n_layers):
            p = f"blk.{i}."
            qkv = parts(p + "attn_qkv", [q_out, kv_out, kv_out], h)
            moe = cfg.n_experts > 0
            if moe:
                f = cfg.shared_expert_ff
            fused_up = (
                parts(p + "ffn_up", [f, f], h)
                if not moe and get(p + "ffn_gate", "matrix") is None
                else None
            )
            sx = "_shexp" if moe else ""
            dense = not moe or f > 0
            layers.append(
                LayerWeights(
                    attn_norm=vector(p + "attn_norm", h, required=not cfg.no_pre_norms),
                    q=qkv[0] if qkv else matrix(p + "attn_q", (q_out, h)),
                    k=qkv[1] if qkv else matrix(p + "attn_k", (kv_out, h)),
                    v=qkv[2] if qkv else matrix(p + "attn_v", (kv_out, h)),
                    o=matrix(p + "attn_output", (h, q_out)),
                    ffn_norm=vector(p + "ffn_norm", h, required=not cfg.no_pre_norms),
                    gate=fused_up[0]
                    if fused_up
                    else (matrix(p + "ffn_gate" + sx, (f, h)) if dense else None),
                    up=fused_up[1]
                    if fused_up
                    else (matrix(p + "ffn_up" + sx, (f, h)) if dense else None),
                    down=matrix(p + "ffn_down" + sx, (h, f)) if dense else None,
                    router=matrix(p + "ffn_gate_inp", (cfg.n_experts, h)) if moe else None,
                    experts=experts(p) if moe else None,
                    shared_gate=vector(p + "ffn_gate_inp_shexp", h) if moe and f else None,
                    q_bias=vector(p + "attn_q.bias", q_out, required=cfg.attention_bias),
                    k_bias=vector(p + "attn_k.bias", kv_out, required=cfg.attention_bias),
                    v_bias=vector(p + "attn_v.bias", kv_out, required=cfg.attention_bias),
                    q_norm=vector(
                        p + "attn_q_norm", q_out if cfg.qk_norm_full else hd, required=cfg.qk_norm
                    ),
                    k_norm=vector(
                        p + "attn_k_norm", kv_out if cfg.qk_norm_full else hd, required=cfg.qk_norm
                    ),
                    attn_post_norm=vector(p + "post_attention_norm", h, required=cfg.post_norms),
                    ffn_post_norm=vector(p + "post_ffw_norm", h, required=cfg.post_norms),
                )
            )
            if on_progress is not None:
                on_progress(i + 1, cfg.n_layers + 1)
        embed = matrix("token_embd", (cfg.vocab_size, h))
        head = get("output", "matrix")
        if head is None or isinstance(head, np.ndarray):
            output = embed
        else:
            output = matrix("output", (cfg.vocab_size, h))
        norm = must(vector("output_norm", h))
        if on_progress is not None:
            on_progress(cfg.n_layers + 1, cfg.n_layers + 1)
        return cls(embed=embed, layers=layers, norm=norm, output=output)


def unpermute_rope_rows(w: npt.NDArray[np.generic], n_heads: int) -> npt.NDArray[np.generic]:
    """Undo llama.cpp's q/k row permutation (interleaved rotary pairs -> rotate-half halves).

    llama.cpp's converter reorders each head's rows from ``[x0..x_{d/2-1}, y0..]`` to
    ``[x0, y0, x1, y1, ...]`` so its NORM-style RoPE rotates adjacent pairs; this runner uses
    the rotate-half convention, so the rows go back to the Hugging Face order. Works on dense
    rows and on rows of packed quantised blocks alike (only whole rows move).
    """
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise WeightFormatError(f"cannot unpermute {rows} rows into {n_heads} heads")
    half = rows // n_heads // 2
    out = w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    return np.ascontiguousarray(out)
