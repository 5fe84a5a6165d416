"""A small, independent numpy forward pass for the default model's GGUF, used to write samples.

It reads the file with ``gguf.GGUFReader``, dequantises every tensor, rebuilds the tokenizer from
``tokenizer.ggml.*`` and generates with a plain KV cache. RoPE rotates adjacent pairs
(x[2i], x[2i+1]), the GGUF convention for architecture "llama" (weights as llama.cpp stores them).

    python tools/numpy_llama.py python/rlx_lm/models/default.gguf [--prompt TEXT] [-n 100]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

F32 = np.float32


class GgufLlama:
    """Weights, hyper-parameters and tokenizer of a llama GGUF file."""

    def __init__(self, path: Path) -> None:
        import gguf

        r = gguf.GGUFReader(str(path))
        self.meta: dict[str, Any] = {}
        for name, field in r.fields.items():
            if not field.types:
                continue
            if field.types[0] == gguf.GGUFValueType.ARRAY:
                if field.types[-1] == gguf.GGUFValueType.STRING:
                    self.meta[name] = [bytes(field.parts[i]).decode() for i in field.data]
                else:
                    self.meta[name] = [field.parts[i][0].item() for i in field.data]
            elif field.types[0] == gguf.GGUFValueType.STRING:
                self.meta[name] = bytes(field.parts[field.data[0]]).decode()
            else:
                self.meta[name] = field.parts[field.data[0]][0].item()
        self.t: dict[str, np.ndarray] = {}
        for ten in r.tensors:
            a = gguf.quants.dequantize(ten.data, ten.tensor_type)
            shape = [int(x) for x in reversed(ten.shape)]
            self.t[ten.name] = np.asarray(a, dtype=F32).reshape(shape)
        m = self.meta
        self.n_layers = int(m["llama.block_count"])
        self.n_heads = int(m["llama.attention.head_count"])
        self.n_kv = int(m["llama.attention.head_count_kv"])
        self.dim = int(m["llama.embedding_length"])
        self.hd = self.dim // self.n_heads
        self.eps = F32(m["llama.attention.layer_norm_rms_epsilon"])
        theta = float(m["llama.rope.freq_base"])
        self.inv = theta ** (-np.arange(0, self.hd, 2, dtype=np.float64) / self.hd)
        self.out_w = self.t.get("output.weight", self.t["token_embd.weight"])
        self.tok = self._tokenizer()
        self.bos = int(m["tokenizer.ggml.bos_token_id"])
        self.eos = int(m["tokenizer.ggml.eos_token_id"])

    def _tokenizer(self) -> Any:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        tokens = self.meta["tokenizer.ggml.tokens"]
        merges = [tuple(x.split(" ", 1)) for x in self.meta["tokenizer.ggml.merges"]]
        tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        return tok

    def _rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        ang = pos[:, None].astype(np.float64) * self.inv[None, :]
        cos, sin = np.cos(ang).astype(F32)[:, None, :], np.sin(ang).astype(F32)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    def logits(
        self, ids: list[int], cache: list[list[np.ndarray]], *, every: bool = False
    ) -> np.ndarray:
        """Logits of the last of ``ids`` (of each, if ``every``), appended after the cache."""
        t = self.t
        p0 = cache[0][0].shape[0] if cache[0] else 0
        n = len(ids)
        pos = np.arange(p0, p0 + n)
        x = t["token_embd.weight"][np.asarray(ids)]
        g = self.n_heads // self.n_kv
        for i in range(self.n_layers):
            b = f"blk.{i}."
            h = self._rms(x, t[b + "attn_norm.weight"])
            q = self._rope((h @ t[b + "attn_q.weight"].T).reshape(n, self.n_heads, self.hd), pos)
            k = self._rope((h @ t[b + "attn_k.weight"].T).reshape(n, self.n_kv, self.hd), pos)
            v = (h @ t[b + "attn_v.weight"].T).reshape(n, self.n_kv, self.hd)
            if cache[i]:
                k = np.concatenate([cache[i][0], k])
                v = np.concatenate([cache[i][1], v])
            cache[i] = [k, v]
            kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
            s = np.einsum("qhd,khd->hqk", q, kk) / np.sqrt(self.hd)
            mask = pos[:, None] >= np.arange(kk.shape[0])[None, :]
            s = np.where(mask[None], s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("hqk,khd->qhd", s, vv).reshape(n, self.dim)
            x = x + o @ t[b + "attn_output.weight"].T
            h = self._rms(x, t[b + "ffn_norm.weight"])
            gate = h @ t[b + "ffn_gate.weight"].T
            up = h @ t[b + "ffn_up.weight"].T
            x = x + ((gate / (1 + np.exp(-gate))) * up) @ t[b + "ffn_down.weight"].T
        x = self._rms(x if every else x[-1:], t["output_norm.weight"])
        z = x @ self.out_w.T
        return z if every else z[0]

    def mean_nll(self, windows: np.ndarray) -> float:
        """Mean next-token negative log-likelihood over rows of token ids."""
        total = 0.0
        for row in windows:
            z = self.logits(list(row[:-1]), [[] for _ in range(self.n_layers)], every=True)
            z = z.astype(np.float64)
            z -= z.max(-1, keepdims=True)
            logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
            total += float(-logp[np.arange(len(row) - 1), row[1:]].mean())
        return total / len(windows)

    def generate(self, prompt: str, n: int, temp: float, seed: int, top_p: float = 1.0) -> str:
        """Continuation of ``prompt`` (BOS prepended); greedy when ``temp`` is 0."""
        rng = np.random.default_rng(seed)
        ids = [self.bos, *self.tok.encode(prompt).ids]
        cache: list[list[np.ndarray]] = [[] for _ in range(self.n_layers)]
        out: list[int] = []
        feed = ids
        for _ in range(n):
            z = self.logits(feed, cache).astype(np.float64)
            if temp <= 0:
                nxt = int(np.argmax(z))
            else:
                p = np.exp((z - z.max()) / temp)
                p /= p.sum()
                order = np.argsort(-p)
                keep = order[: int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1]
                q = p[keep] / p[keep].sum()
                nxt = int(rng.choice(keep, p=q))
            if nxt == self.eos:
                break
            out.append(nxt)
            feed = [nxt]
        return str(self.tok.decode(out))


PROMPTS = (
    "Once upon a time",
    "It is a truth universally acknowledged",
    "Mr. Darcy",
    "She walked into the room and",
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--prompt", action="append")
    parser.add_argument("-n", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    t0 = time.time()
    model = GgufLlama(args.gguf)
    print(f"loaded in {time.time() - t0:.2f}s")
    for prompt in args.prompt or PROMPTS:
        for temp, top_p in ((0.0, 1.0), (0.8, 0.95)):
            t0 = time.time()
            text = model.generate(prompt, args.n, temp, args.seed, top_p)
            label = "greedy" if temp == 0 else f"temp {temp}, top-p {top_p}, seed {args.seed}"
            print(f"--- [{label}] ({time.time() - t0:.2f}s)\n{prompt}{text}\n")


if __name__ == "__main__":
    main()
