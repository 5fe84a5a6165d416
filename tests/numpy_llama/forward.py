"""The Llama-family forward pass in float32 numpy, over any KV store, in bounded-memory chunks.

The runner's forward pass before it moved into Rust; kept as the reference the engine is
tested against (same float32 arithmetic over the dequantised weights, one matmul per
projection)."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

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


class LlamaForward:
    """Runs token chunks through the blocks of one model, appending their K/V to a store."""

    def __init__(self, cfg: LlamaConfig, weights: LlamaWeights, *, chunk: int = 128) -> None:
        self.cfg = cfg
        self.w = weights
        self.chunk = max(1, chunk)
        self._inv_freq = cfg.inv_freq()
        self._pos_scale = cfg.position_scale()
        self._cos = np.empty((0, cfg.head_dim // 2), dtype=np.float32)
        self._sin = np.empty((0, cfg.head_dim // 2), dtype=np.float32)
        self._scale = np.float32(1.0 / np.sqrt(cfg.head_dim))
        self._eps = np.float32(cfg.rms_norm_eps)

    # ----------------------------------------------------------------- pieces

    def _rope_tables(self, pos0: int, n: int) -> tuple[F32, F32]:
        end = pos0 + n
        if end > self._cos.shape[0]:
            size = max(end, 2 * self._cos.shape[0], 64)
            pos = np.arange(size, dtype=np.float64) / self._pos_scale
            ang = np.outer(pos, self._inv_freq)
            self._cos = np.cos(ang).astype(np.float32)
            self._sin = np.sin(ang).astype(np.float32)
        return self._cos[pos0:end], self._sin[pos0:end]

    @staticmethod
    def _rope(x: F32, cos: F32, sin: F32) -> F32:
        # rotate-half (NEOX) convention: pair i is (x[i], x[i + d/2]).
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        out = np.empty_like(x)
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half:] = x2 * cos + x1 * sin
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
        q = q.reshape(n, cfg.n_heads, hd).transpose(1, 0, 2)
        k = k.reshape(n, nkv, hd).transpose(1, 0, 2)
        v = np.ascontiguousarray(v.reshape(n, nkv, hd).transpose(1, 0, 2))
        if lw.q_norm is not None and lw.k_norm is not None:
            q = rms_norm(q, lw.q_norm, cfg.rms_norm_eps)
            k = rms_norm(k, lw.k_norm, cfg.rms_norm_eps)
        cos, sin = self._rope_tables(pos0, n)
        q = self._rope(q, cos, sin)
        k = self._rope(k, cos, sin)
        store.append(layer, k, v)
        keys = store.keys(layer)
        values = store.values(layer)
        window = cfg.sliding_window
        if window is not None and keys.shape[1] - n + 1 > window:
            # no query of this chunk sees keys before its first query's window
            first = keys.shape[1] - n + 1 - window
            keys, values = keys[:, first:], values[:, first:]
        total = keys.shape[1]
        # Query head j*group+g reads kv head j: fold the group into the query rows.
        qg = q.reshape(nkv, group * n, hd)
        scores = np.matmul(qg, keys.transpose(0, 2, 1))
        scores *= self._scale
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

    def _block(self, layer: int, x: F32, store: KvStore, pos0: int) -> F32:
        lw = self.w.layers[layer]
        x = x + self._attention(
            lw, layer, rms_norm(x, lw.attn_norm, self.cfg.rms_norm_eps), store, pos0
        )
        h = rms_norm(x, lw.ffn_norm, self.cfg.rms_norm_eps)
        gate = lw.gate.apply(h)
        # silu(g) = g * sigmoid(g), with sigmoid written through tanh so it cannot overflow.
        act: F32 = np.tanh(gate * np.float32(0.5))
        act += np.float32(1.0)
        act *= np.float32(0.5)
        act *= gate
        act *= lw.up.apply(h)
        out: F32 = x + lw.down.apply(act)
        return out

    # ------------------------------------------------------------------ API

    def run_chunk(self, ids: npt.NDArray[np.intp], store: KvStore, pos0: int) -> F32:
        """Hidden states ``[n, hidden]`` (before the final norm) of ``ids`` at ``pos0..``."""
        x = self.w.embed.rows(ids)
        for layer in range(self.cfg.n_layers):
            x = self._block(layer, x, store, pos0)
        return x

    def logits(self, hidden: F32) -> F32:
        """Output-head logits ``[n, vocab]`` of hidden states ``[n, hidden]``."""
        return self.w.output.apply(rms_norm(hidden, self.w.norm, self.cfg.rms_norm_eps))

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
