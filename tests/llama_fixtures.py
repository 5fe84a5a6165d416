"""Helpers shared by the Llama runner tests: a list-backed KV store double and model loading."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from numpy_llama.forward import LlamaForward
from numpy_llama.gguf_file import open_gguf
from numpy_llama.loaders import SafetensorsCheckpoint, gguf_weights

from rlx_lm.runners.llama_config import LlamaConfig


class ListKv:
    """The simplest KV store: per-layer arrays grown by concatenation (a test double)."""

    def __init__(self, n_layers: int) -> None:
        self.k: list[np.ndarray | None] = [None] * n_layers
        self.v: list[np.ndarray | None] = [None] * n_layers

    def append(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        old_k, old_v = self.k[layer], self.v[layer]
        self.k[layer] = k.copy() if old_k is None else np.concatenate([old_k, k], axis=1)
        self.v[layer] = v.copy() if old_v is None else np.concatenate([old_v, v], axis=1)

    def keys(self, layer: int) -> np.ndarray:
        k = self.k[layer]
        assert k is not None
        return k

    def values(self, layer: int) -> np.ndarray:
        v = self.v[layer]
        assert v is not None
        return v


def forward_from_dir(path: Path, *, chunk: int = 128) -> LlamaForward:
    ck, cfg_path = SafetensorsCheckpoint.locate(path)
    assert cfg_path is not None
    cfg = LlamaConfig.from_hf(json.loads(cfg_path.read_text()))
    return LlamaForward(cfg, ck.weights(cfg), chunk=chunk)


def forward_from_gguf(path: Path, *, packed: bool = False, chunk: int = 128) -> LlamaForward:
    g = open_gguf(path)
    cfg = g.config()
    return LlamaForward(cfg, gguf_weights(g, cfg, packed=packed), chunk=chunk)


def all_logits(fw: LlamaForward, ids: list[int]) -> np.ndarray:
    return fw.prefill(np.asarray(ids, dtype=np.intp), ListKv(fw.cfg.n_layers), 0, all_logits=True)
