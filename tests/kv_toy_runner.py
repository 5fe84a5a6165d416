"""A tiny numpy transformer on rlx_lm.KvCache, with the session methods, for tests.

Grouped-query causal attention with learned positions; random weights. It has
two forward paths: the cached one (appends to a KvCache layer by layer and
attends over its views) and `reference_logits`, a plain from-scratch
computation over whole arrays, with no cache at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rlx_lm import KvCache, ModelFingerprint, SessionSnapshot

VOCAB, D_MODEL, N_LAYERS, N_HEADS, N_KV_HEADS, HEAD_DIM, MAX_POS = 40, 16, 2, 4, 2, 4, 64


class ToyRunner:
    """Session-capable runner over a KvCache."""

    def __init__(self, seed: int = 0, max_seq: int = MAX_POS, dtype: str = "float32") -> None:
        rng = np.random.default_rng(seed)

        def w(*shape: int) -> np.ndarray:
            return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

        self.emb = w(VOCAB, D_MODEL)
        self.pos = w(MAX_POS, D_MODEL)
        self.wq = [w(D_MODEL, N_HEADS * HEAD_DIM) for _ in range(N_LAYERS)]
        self.wk = [w(D_MODEL, N_KV_HEADS * HEAD_DIM) for _ in range(N_LAYERS)]
        self.wv = [w(D_MODEL, N_KV_HEADS * HEAD_DIM) for _ in range(N_LAYERS)]
        self.wo = [w(N_HEADS * HEAD_DIM, D_MODEL) for _ in range(N_LAYERS)]
        self.out = w(D_MODEL, VOCAB)
        geometry = (N_LAYERS, N_HEADS, N_KV_HEADS, HEAD_DIM, VOCAB)
        self.fingerprint = ModelFingerprint("toy", geometry, f"seed-{seed}")
        self.cache = KvCache(
            n_layers=N_LAYERS,
            n_kv_heads=N_KV_HEADS,
            head_dim=HEAD_DIM,
            max_seq=max_seq,
            dtype=dtype,
        )
        self.tokens: list[int] = []
        self.prefill_calls: list[int] = []  # tokens computed per prefill, to see reuse

    # ---------------------------------------------------------------- forward

    def _attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int) -> np.ndarray:
        """q [n, N_HEADS, hd]; k, v [N_KV_HEADS, T, hd]; causal from absolute `start`."""
        n, t = q.shape[0], k.shape[1]
        group = N_HEADS // N_KV_HEADS
        kk = np.repeat(k.astype(np.float32), group, axis=0)  # [N_HEADS, T, hd]
        vv = np.repeat(v.astype(np.float32), group, axis=0)
        scores = np.einsum("nhd,htd->hnt", q, kk) / math.sqrt(HEAD_DIM)
        mask = np.arange(t)[None, :] > (start + np.arange(n))[:, None]
        scores = np.where(mask[None], -np.inf, scores)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        return np.einsum("hnt,htd->nhd", scores, vv).reshape(n, N_HEADS * HEAD_DIM)

    def _forward(self, ids: Sequence[int], start: int) -> np.ndarray:
        ids_arr = np.asarray(ids, dtype=np.intp)
        x = self.emb[ids_arr] + self.pos[start : start + len(ids_arr)]
        n = len(ids_arr)
        for layer in range(N_LAYERS):
            q = (x @ self.wq[layer]).reshape(n, N_HEADS, HEAD_DIM)
            k = (x @ self.wk[layer]).reshape(n, N_KV_HEADS, HEAD_DIM).transpose(1, 0, 2)
            v = (x @ self.wv[layer]).reshape(n, N_KV_HEADS, HEAD_DIM).transpose(1, 0, 2)
            self.cache.append(layer, k, v)
            attn = self._attend(q, self.cache.keys(layer), self.cache.values(layer), start)
            x = x + attn @ self.wo[layer]
        self.prefill_calls.append(n)
        return (x[-1] @ self.out).astype(np.float32)

    def reference_logits(self, ids: Sequence[int]) -> np.ndarray:
        """Last-position logits computed from scratch, without any cache."""
        ids_arr = np.asarray(ids, dtype=np.intp)
        n = len(ids_arr)
        x = self.emb[ids_arr] + self.pos[:n]
        for layer in range(N_LAYERS):
            q = (x @ self.wq[layer]).reshape(n, N_HEADS, HEAD_DIM)
            k = (x @ self.wk[layer]).reshape(n, N_KV_HEADS, HEAD_DIM).transpose(1, 0, 2)
            v = (x @ self.wv[layer]).reshape(n, N_KV_HEADS, HEAD_DIM).transpose(1, 0, 2)
            x = x + self._attend(q, k, v, 0) @ self.wo[layer]
        return (x[-1] @ self.out).astype(np.float32)

    # ---------------------------------------------------------------- session

    def prefill_logits(self, prompt_ids: Sequence[int], /) -> np.ndarray:
        self.cache.clear()
        logits = self._forward(prompt_ids, 0)
        self.tokens = [int(t) for t in prompt_ids]
        return logits

    def decode_logits(self, token: int, /) -> np.ndarray:
        logits = self._forward([token], len(self.tokens))
        self.tokens.append(int(token))
        return logits

    def prefill_logits_reusing(
        self, prompt_ids: Sequence[int], snapshot: SessionSnapshot, reuse_len: int, /
    ) -> np.ndarray:
        prompt = [int(t) for t in prompt_ids]
        keep = min(reuse_len, len(prompt) - 1)
        assert tuple(prompt[:keep]) == snapshot.tokens[:keep]
        snapshot.restore_into(self.cache, self.fingerprint, keep)
        logits = self._forward(prompt[keep:], keep)
        self.tokens = prompt
        return logits

    def export_session(self) -> SessionSnapshot:
        return SessionSnapshot(self.cache.snapshot(), self.tokens, self.fingerprint)

    def restore_session(self, snapshot: SessionSnapshot, /) -> bool:
        snapshot.restore_into(self.cache, self.fingerprint)
        self.tokens = list(snapshot.tokens)
        return True
