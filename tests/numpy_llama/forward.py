"""The Llama-family forward pass in float32 numpy, over any KV store, in bounded-memory chunks.

The runner's forward pass before it moved into Rust; kept as the reference the engine is
tested against (same float32 arithmetic over the dequantised weights, one matmul per
projection)."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from numpy_llama.linear import Matrix
from numpy_llama.weights import LayerWeights, LlamaWeights
from rlx_lm.runners.llama_config import LlamaConfig

__all__ = ["KvStore", "LlamaForward"]

F32 = npt.NDArray[np.float32]


class KvStore(Protocol):
    """What the forward pass needs of a KV cache (``rlx_lm.KvCache`` meets it)."""

    def append(self, layer: int, k: F32, v: F32) -> None:
        """Append rows ``[n_kv_heads, n_new, head_dim]`` to ``layer``."""
        ...

    def keys(self, layer: int) -> F32:
        """All keys of ``layer`` so far, ``[n_kv_heads, len, head_dim]``."""
        ...

    def values(self, layer: int) -> F32:
        """All values of ``layer`` so far, ``[n_kv_heads, len, head_dim]``."""
        ...


def rms_norm(x: F32, w: F32, eps: float) -> F32:
    """Root-mean-square normalisation over the last axis, scaled by ``w``."""
    ms = np.mean(np.square(x), axis=-1, keepdims=True, dtype=np.float32)
    out: F32 = x * (1.0 / np.sqrt(ms + np.float32(eps))) * w
    return out


class _Rope:
    """cos/sin tables of one set of RoPE frequencies, grown as positions are asked for."""

    def __init__(
        self, inv_freq: npt.NDArray[np.float64], pos_scale: float, mscale: float = 1.0
    ) -> None:
        self.inv_freq = inv_freq
        self.mscale = mscale
        self.pos_scale = pos_scale
        self.cos = np.empty((0, inv_freq.size), dtype=np.float32)
        self.sin = np.empty((0, inv_freq.size), dtype=np.float32)

    def tables(self, pos0: int, n: int) -> tuple[F32, F32]:
        end = pos0 + n
        if end > self.cos.shape[0]:
            size = max(end, 2 * self.cos.shape[0], 64)
            pos = np.arange(size, dtype=np.float64) / self.pos_scale
            ang = np.outer(pos, self.inv_freq)
            self.cos = (np.cos(ang) * self.mscale).astype(np.float32)
            self.sin = (np.sin(ang) * self.mscale).astype(np.float32)
        return self.cos[pos0:end], self.sin[pos0:end]


class LlamaForward:
    """Runs token chunks through the blocks of one model, appending their K/V to a store."""

    def __init__(self, cfg: LlamaConfig, weights: LlamaWeights, *, chunk: int = 128) -> None:
        self.cfg = cfg
        self.w = weights
        self.chunk = max(1, chunk)
        self._eps = np.float32(cfg.rms_norm_eps)
        self._scale = np.float32(cfg.score_scale())
        # RoPE tables: the model's, and the windowed layers' own (Gemma 3), grown as needed.
        local = cfg.local_inv_freq()
        self._ropes = {
            False: _Rope(cfg.inv_freq(), cfg.position_scale(), cfg.rope_mscale),
            True: _Rope(
                cfg.inv_freq() if local is None else local,
                cfg.position_scale() if local is None else 1.0,
                cfg.rope_mscale if local is None else 1.0,
            ),
        }

    # ----------------------------------------------------------------- pieces

    def _rope_tables(self, layer: int, pos0: int, n: int) -> tuple[F32, F32]:
        windowed = self.cfg.window_of(layer) is not None
        return self._ropes[windowed].tables(pos0, n)

    @staticmethod
    def _rope(x: F32, cos: F32, sin: F32) -> F32:
        # rotate-half (NEOX) convention over the rotated elements: pair i is (x[i], x[i + p])
        # for p = cos's width; elements from 2p on pass through (partial RoPE).
        half = cos.shape[-1]
        x1, x2 = x[..., :half], x[..., half : 2 * half]
        out = x.copy()
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half : 2 * half] = x2 * cos + x1 * sin
        return out

    def _attention(self, lw: LayerWeights, layer: int, h: F32, store: KvStore, pos0: int) -> F32:
        cfg = self.cfg
        n, hd, nkv = h.shape[0], cfg.head_dim, cfg.n_kv_heads
        group = cfg.n_heads // nkv
        q = lw.q.apply(h)
        k = lw.k.apply(h)
        v = lw.v.apply(h)
        if lw.q_bias is not None:
            q += lw.q_bias
        if lw.k_bias is not None:
            k += lw.k_bias
        if lw.v_bias is not None:
            v += lw.v_bias
        full = cfg.qk_norm_full and lw.q_norm is not None and lw.k_norm is not None
        if full:  # OLMo: over the whole projection
            q = rms_norm(q, lw.q_norm, cfg.rms_norm_eps)
            k = rms_norm(k, lw.k_norm, cfg.rms_norm_eps)
        q = q.reshape(n, cfg.n_heads, hd).transpose(1, 0, 2)
        k = k.reshape(n, nkv, hd).transpose(1, 0, 2)
        v = np.ascontiguousarray(v.reshape(n, nkv, hd).transpose(1, 0, 2))
        if lw.q_norm is not None and lw.k_norm is not None and not full:
            q = rms_norm(q, lw.q_norm, cfg.rms_norm_eps)
            k = rms_norm(k, lw.k_norm, cfg.rms_norm_eps)
        cos, sin = self._rope_tables(layer, pos0, n)
        if cfg.rotates(layer):
            q = self._rope(q, cos, sin)
            k = self._rope(k, cos, sin)
        store.append(layer, k, v)
        keys = store.keys(layer)
        values = store.values(layer)
        window = cfg.window_of(layer)
        if window is not None and keys.shape[1] - n + 1 > window:
            # no query of this chunk sees keys before its first query's window
            first = keys.shape[1] - n + 1 - window
            keys, values = keys[:, first:], values[:, first:]
        total = keys.shape[1]
        # Query head j*group+g reads kv head j: fold the group into the query rows.
        qg = q.reshape(nkv, group * n, hd)
        scores = np.matmul(qg, keys.transpose(0, 2, 1))
        scores *= self._scale
        if cfg.attn_softcap is not None:
            cap = np.float32(cfg.attn_softcap)
            scores = np.tanh(scores / cap) * cap
        if n > 1:
            # query i sits at column total-n+i and sees keys up to it (and, with a window,
            # only the last `window` of them).
            col = np.arange(total)[None, :]
            row = (np.arange(n) + (total - n))[:, None]
            hidden = col > row
            if window is not None:
                hidden |= col <= row - window
            scores.reshape(nkv, group, n, total)[:, :, hidden] = -np.inf
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        ctx = np.matmul(scores, values).reshape(cfg.n_heads, n, hd)
        return lw.o.apply(np.ascontiguousarray(ctx.transpose(1, 0, 2)).reshape(n, cfg.n_heads * hd))

    def _mlp(
        self, gate_m: Matrix | None, up_m: Matrix | None, down_m: Matrix | None, h: F32
    ) -> F32:
        assert gate_m is not None
        assert up_m is not None
        assert down_m is not None
        gate = gate_m.apply(h)
        if self.cfg.gelu:
            # GELU, tanh form: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
            inner = np.float32(np.sqrt(2 / np.pi)) * (gate + np.float32(0.044715) * gate**3)
            act: F32 = np.float32(0.5) * gate * (np.float32(1.0) + np.tanh(inner))
        else:
            # silu(g) = g * sigmoid(g), with sigmoid written through tanh so it cannot overflow.
            act = np.tanh(gate * np.float32(0.5))
            act += np.float32(1.0)
            act *= np.float32(0.5)
            act *= gate
        act *= up_m.apply(h)
        out: F32 = down_m.apply(act)
        return out

    def _moe(self, lw: LayerWeights, h: F32) -> F32:
        """A mixture of experts: each row's top ``n_experts_used`` experts by router softmax,
        weighted (renormalised when ``experts_norm``); plus a shared expert times
        ``sigmoid(h . shared_gate)`` (Qwen2-MoE)."""
        cfg = self.cfg
        assert lw.router is not None
        assert lw.experts is not None
        z = lw.router.apply(h)
        probs = np.exp(z - z.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        out = np.zeros_like(h)
        for r in range(h.shape[0]):
            top = np.argsort(-probs[r], kind="stable")[: cfg.n_experts_used]
            weights = probs[r, top]
            if cfg.experts_norm:
                weights = weights / weights.sum()
            for e, wt in zip(top, weights, strict=True):
                out[r] += wt * self._mlp(*lw.experts[e], h[r : r + 1])[0]
        if lw.shared_gate is not None:
            g = np.float32(1.0) / (np.float32(1.0) + np.exp(-(h @ lw.shared_gate)))
            out += self._mlp(lw.gate, lw.up, lw.down, h) * g[:, None]
        return out

    def _block(self, layer: int, x: F32, store: KvStore, pos0: int) -> F32:
        lw = self.w.layers[layer]
        eps = self.cfg.rms_norm_eps
        # OLMo 2 has no norm before attention or the MLP.
        o = self._attention(
            lw, layer, x if lw.attn_norm is None else rms_norm(x, lw.attn_norm, eps), store, pos0
        )
        if lw.attn_post_norm is not None:
            o = rms_norm(o, lw.attn_post_norm, eps)
        rs = np.float32(self.cfg.residual_scale)  # Granite's; 1 elsewhere
        x = x + o * rs
        h = x if lw.ffn_norm is None else rms_norm(x, lw.ffn_norm, eps)
        mlp = self._moe(lw, h) if lw.experts is not None else self._mlp(lw.gate, lw.up, lw.down, h)
        if lw.ffn_post_norm is not None:
            mlp = rms_norm(mlp, lw.ffn_post_norm, eps)
        out: F32 = x + mlp * rs
        return out

    # ------------------------------------------------------------------ API

    def run_chunk(self, ids: npt.NDArray[np.intp], store: KvStore, pos0: int) -> F32:
        """Hidden states ``[n, hidden]`` (before the final norm) of ``ids`` at ``pos0..``."""
        x = self.w.embed.rows(ids)
        if self.cfg.embed_scale != 1.0:
            x = x * np.float32(self.cfg.embed_scale)
        for layer in range(self.cfg.n_layers):
            x = self._block(layer, x, store, pos0)
        return x

    def logits(self, hidden: F32) -> F32:
        """Output-head logits ``[n, vocab]`` of hidden states ``[n, hidden]``."""
        logits = self.w.output.apply(rms_norm(hidden, self.w.norm, self.cfg.rms_norm_eps))
        if self.cfg.logit_scale != 1.0:
            logits = logits * np.float32(1.0 / self.cfg.logit_scale)
        if self.cfg.final_softcap is not None:
            cap = np.float32(self.cfg.final_softcap)
            logits = np.tanh(logits / cap) * cap
        return logits

    def prefill(
        self,
        ids: npt.NDArray[np.intp],
        store: KvStore,
        pos0: int,
        *,
        all_logits: bool = False,
        on_chunk: object = None,
    ) -> F32:
        """Feed ``ids`` in chunks; return the last position's logits (or every position's)."""
        outs: list[F32] = []
        last = np.empty((0, self.cfg.hidden_size), dtype=np.float32)
        for lo in range(0, len(ids), self.chunk):
            hi = min(lo + self.chunk, len(ids))
            last = self.run_chunk(ids[lo:hi], store, pos0 + lo)
            if all_logits:
                outs.append(self.logits(last))
            if callable(on_chunk):
                on_chunk(hi, len(ids))
        if all_logits:
            return np.concatenate(outs, axis=0)
        row: F32 = self.logits(last[-1:])[0]
        return row
