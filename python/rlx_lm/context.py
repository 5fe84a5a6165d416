"""The default context of a model: its trained length, capped by a memory budget.

`load_model` and the command line use it when no ``max_seq`` is given (the builder keeps its
own default of 128). The KV cache commits memory only as tokens are stored, so a long default
costs nothing until it is used; the cap keeps a model trained on a very long context from
reserving more KV memory than the machine could ever back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rlx_lm._core import KV_MAX_SEQ
from rlx_lm._headers import read_gguf_header

__all__ = ["FALLBACK_CONTEXT", "KV_BUDGET_FRACTION", "default_context", "kv_bytes_per_token"]

FALLBACK_CONTEXT = 4096
"""Context used when the weights do not say what they were trained with."""

KV_BUDGET_FRACTION = 0.5
"""Share of the available memory a default context may fill with its KV cache."""

_ITEMSIZE = {"float32": 4, "float16": 2}


def _available_memory() -> int | None:
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def _gguf_geometry(path: Path) -> dict[str, int | None]:
    meta = read_gguf_header(path).metadata
    arch = meta.get("general.architecture")

    def get(key: str) -> int | None:
        value = meta.get(f"{arch}.{key}")
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    heads = get("attention.head_count")
    hidden = get("embedding_length")
    head_dim = get("attention.key_length") or (hidden // heads if hidden and heads else None)
    return {
        "context": get("context_length"),
        "layers": get("block_count"),
        "kv_heads": get("attention.head_count_kv") or heads,
        "head_dim": head_dim,
    }


def _config_geometry(path: Path) -> dict[str, int | None]:
    import json

    directory = path if path.is_dir() else path.parent
    try:
        cfg: Any = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(cfg, dict):
        return {}

    def get(key: str) -> int | None:
        value = cfg.get(key)
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    heads = get("num_attention_heads")
    hidden = get("hidden_size")
    return {
        "context": get("max_position_embeddings"),
        "layers": get("num_hidden_layers"),
        "kv_heads": get("num_key_value_heads") or heads,
        "head_dim": get("head_dim") or (hidden // heads if hidden and heads else None),
    }


def _geometry(path: Path) -> dict[str, int | None]:
    try:
        with open(path, "rb") as fh:
            is_gguf = path.is_file() and fh.read(4) == b"GGUF"
    except OSError:
        is_gguf = False
    return _gguf_geometry(path) if is_gguf else _config_geometry(path)


def kv_bytes_per_token(path: str | os.PathLike[str], kv_dtype: str = "float32") -> int | None:
    """KV-cache bytes one token takes (keys and values of every layer), if the header says."""
    g = _geometry(Path(path))
    layers, kv_heads, head_dim = g.get("layers"), g.get("kv_heads"), g.get("head_dim")
    if not (layers and kv_heads and head_dim):
        return None
    return 2 * layers * kv_heads * head_dim * _ITEMSIZE.get(kv_dtype, 4)


def default_context(
    path: str | os.PathLike[str],
    *,
    kv_dtype: str = "float32",
    budget_bytes: int | None = None,
) -> int:
    """The model's trained context (``<arch>.context_length`` or ``max_position_embeddings``),
    capped so its KV cache fits ``budget_bytes`` (default: half the available memory) and at
    the cache's limit, ``rlx_lm._core.KV_MAX_SEQ`` tokens."""
    p = Path(path)
    g = _geometry(p)
    trained = g.get("context") or FALLBACK_CONTEXT
    per_token = kv_bytes_per_token(p, kv_dtype)
    budget = budget_bytes
    if budget is None:
        free = _available_memory()
        budget = None if free is None else int(free * KV_BUDGET_FRACTION)
    if per_token and budget is not None:
        trained = min(trained, max(256, budget // per_token))
    # A header may claim any context (2^32 - 1 fits its field); the cache holds at most
    # KV_MAX_SEQ tokens, so a longer claim would make the default itself refused.
    return max(1, min(int(trained), KV_MAX_SEQ))
