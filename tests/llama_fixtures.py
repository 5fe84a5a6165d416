"""Helpers shared by the Llama runner tests: a list-backed KV store double and model loading."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from llama_reference import reference_logits
from model_factory import TinyModel, write_gguf, write_safetensors_dir
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


def check_both_formats(model: TinyModel, tmp: Path, ids: list[int], *, decode: int = 3) -> None:
    """``model`` written as GGUF and as safetensors gives the float64
    reference's logits at every position of ``ids`` in both, by prefill and (from position
    ``decode`` on, when it is positive) by cached decode steps."""
    from rlx_lm.runners.llama import load_llama

    want = reference_logits(model.config, model.tensors, ids)
    tol = 2e-5 * np.abs(want).max() + 1e-5
    for path in (write_gguf(model, tmp / "m.gguf"), write_safetensors_dir(model, tmp / "st")):
        runner = load_llama(path, max_seq=32)
        got = np.stack([runner.predict_logits(ids[: n + 1]) for n in range(len(ids))])
        np.testing.assert_allclose(got, want, rtol=0, atol=tol)
        if decode > 0:
            runner.prefill_logits(ids[:decode])
            steps = np.stack([runner.decode_logits(t) for t in ids[decode:]])
            np.testing.assert_allclose(steps, want[decode:], rtol=0, atol=tol)
