"""Numpy weights for the reference forward: GGUF (dequantised or packed) and safetensors."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from model_factory import expert_of

from numpy_llama.gguf_file import GgufFile
from numpy_llama.linear import DenseMatrix, Matrix, PackedMatrix
from numpy_llama.weights import LlamaWeights, unpermute_rope_rows
from rlx_lm._headers import SAFETENSORS_INDEX, read_safetensors_header, read_safetensors_index
from rlx_lm.errors import UnsupportedError, WeightFormatError
from rlx_lm.runners.llama_config import LlamaConfig

# Architectures whose q/k rows llama.cpp's converter permutes for its NORM-style RoPE.
_PERMUTED_ARCHS = ("llama", "mistral", "granite", "granitemoe", "smollm3")


def gguf_weights(
    g: GgufFile,
    cfg: LlamaConfig,
    *,
    packed: bool,
    on_progress: Callable[[int, int], None] | None = None,
) -> LlamaWeights:
    """Load every tensor; ``packed`` keeps quantised matrices as blocks, dequantised per use."""
    self = g
    # ERNIE 4.5 pairs (2i, 2i + 1) natively: un-permuting its rows as llama.cpp's converter's
    # output lets the rotate-half forward run it (q . k is unchanged by one permutation of both).
    permute = cfg.arch in (*_PERMUTED_ARCHS, "ernie4_5")

    def get(name: str, kind: str) -> Matrix | npt.NDArray[np.float32] | None:
        t = self.tensors.get(name if name.endswith(".bias") else name + ".weight")
        if t is None:
            return None
        heads = 0
        if permute and name.endswith(("attn_q", "attn_k", "attn_q.bias", "attn_k.bias")):
            heads = cfg.n_heads if ".attn_q" in name else cfg.n_kv_heads
        if kind == "vector":
            vec = self._dequant(t)
            return _f32(unpermute_rope_rows(vec, heads)) if heads else vec
        if kind == "stack":
            # The experts' matrices as one [n, rows, cols] tensor: one matrix each.
            n, rows, cols = (int(d) for d in reversed(t.shape))
            if packed and t.tensor_type.name != "F32":
                raw = np.asarray(t.data).view(np.uint8).reshape(n * rows, -1)
                return [
                    PackedMatrix(raw[e * rows : (e + 1) * rows], t.tensor_type, (rows, cols))
                    for e in range(n)
                ]
            return [DenseMatrix(np.ascontiguousarray(m)) for m in self._dequant(t)]
        if len(t.shape) != 2:
            raise WeightFormatError(f"{self.path}: tensor {t.name} is not a matrix")
        shape = (int(t.shape[1]), int(t.shape[0]))
        if packed and t.tensor_type.name != "F32":
            raw = np.asarray(t.data)
            if raw.dtype != np.uint8:
                raw = raw.view(np.uint8).reshape(shape[0], -1)
            if heads:
                raw = unpermute_rope_rows(raw, heads)
            return PackedMatrix(raw, t.tensor_type, shape)
        w = self._dequant(t)
        return DenseMatrix(_f32(unpermute_rope_rows(w, heads)) if heads else w)

    return LlamaWeights.gather(cfg, get, where=str(self.path), on_progress=on_progress)


def _f32(a: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    return np.asarray(a, dtype=np.float32)


_DTYPES: dict[str, np.dtype[Any]] = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "F64": np.dtype("<f8"),
}

_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "attn_q",
    "self_attn.k_proj.weight": "attn_k",
    "self_attn.v_proj.weight": "attn_v",
    "self_attn.o_proj.weight": "attn_output",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm",
    "self_attn.k_norm.weight": "attn_k_norm",
    "post_attention_layernorm.weight": "ffn_norm",
    "mlp.gate_proj.weight": "ffn_gate",
    "mlp.up_proj.weight": "ffn_up",
    "mlp.down_proj.weight": "ffn_down",
    "self_attn.qkv_proj.weight": "attn_qkv",
    "mlp.gate_up_proj.weight": "ffn_up",
    "mlp.gate.weight": "ffn_gate_inp",
    "block_sparse_moe.gate.weight": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp",
    # Granite MoE: stacks of every expert's matrices (gate and up in one, gate first).
    "block_sparse_moe.router.layer.weight": "ffn_gate_inp",
    "block_sparse_moe.input_linear.weight": "ffn_gate_up_exps",
    "block_sparse_moe.output_linear.weight": "ffn_down_exps",
}

# Gemma 2/3: a norm after attention, and one before and one after the MLP.
_POST_NORM_NAMES = {
    **_LAYER_NAMES,
    "post_attention_layernorm.weight": "post_attention_norm",
    "pre_feedforward_layernorm.weight": "ffn_norm",
    "post_feedforward_layernorm.weight": "post_ffw_norm",
}
_TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd",
    "model.norm.weight": "output_norm",
    "lm_head.weight": "output",
}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")

# A header larger than this is refused before it is read (real headers are a few MB at most).
_MAX_HEADER = 256 * 1024 * 1024


class _StFile:
    """One safetensors file: its parsed header and a memory map of its data."""

    def __init__(self, path: Path) -> None:
        self.path = path
        parsed = read_safetensors_header(path)  # the one bounds-checked reader
        self.header: dict[str, Any] = {
            name: {"dtype": dtype, "shape": list(shape), "data_offsets": list(parsed.offsets[name])}
            for name, (dtype, shape) in parsed.tensors.items()
        }
        self.base = parsed.data_offset
        self.size = parsed.file_size
        self._map: np.memmap[Any, np.dtype[np.uint8]] | None = None

    def tensor(self, name: str) -> npt.NDArray[np.float32]:
        info = self.header[name]
        dtype = _DTYPES.get(info.get("dtype", ""))
        if dtype is None:
            raise UnsupportedError(
                f"{self.path}: tensor {name} has dtype {info.get('dtype')}, "
                f"supported: {', '.join(_DTYPES)}"
            )
        shape = tuple(int(d) for d in info["shape"])
        lo, hi = (int(x) for x in info["data_offsets"])
        count = int(np.prod(shape, dtype=np.int64))
        if hi - lo != count * dtype.itemsize or self.base + hi > self.size or lo < 0:
            raise WeightFormatError(f"{self.path}: tensor {name} has inconsistent offsets")
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        raw = self._map[self.base + lo : self.base + hi].view(dtype).reshape(shape)
        if info["dtype"] == "BF16":
            return (raw.astype(np.uint32) << 16).view(np.float32)
        return np.asarray(raw, dtype=np.float32)


class SafetensorsCheckpoint:
    """The safetensors files of one model and the map from tensor name to file."""

    def __init__(self, files: list[Path]) -> None:
        if not files:
            raise WeightFormatError("no .safetensors files found")
        self.files = [_StFile(f) for f in files]
        self.index: dict[str, _StFile] = {}
        for f in self.files:
            for name in f.header:
                self.index[name] = f
        if any(n.endswith((".scales", ".biases")) for n in self.index):
            raise UnsupportedError(
                f"{files[0]}: MLX-quantised weights (.scales/.biases) are not supported; "
                "use an unquantized checkpoint or a GGUF file"
            )

    @classmethod
    def locate(cls, path: Path) -> tuple[SafetensorsCheckpoint, Path | None]:
        """The weight files of ``path`` (a file or a directory) and the config.json beside them."""
        if path.is_dir():
            index = path / SAFETENSORS_INDEX
            shards = read_safetensors_index(path)  # names confined to the directory
            if shards is not None:
                files = list(shards)
                missing = [str(f) for f in files if not f.is_file()]
                if missing:
                    raise WeightFormatError(f"{index}: shard files missing: {', '.join(missing)}")
            else:
                files = sorted(path.glob("*.safetensors"))
            cfg = path / "config.json"
            if not files:
                raise WeightFormatError(f"{path}: directory holds no .safetensors files")
            return cls(files), cfg if cfg.is_file() else None
        if not path.is_file():
            raise WeightFormatError(f"{path}: no such file or directory")
        cfg = path.parent / "config.json"
        return cls([path]), cfg if cfg.is_file() else None

    def weights(
        self, cfg: LlamaConfig, *, on_progress: Callable[[int, int], None] | None = None
    ) -> LlamaWeights:
        """Load every tensor under llama.cpp's names as float32."""
        renamed: dict[str, str] = {}
        names = _POST_NORM_NAMES if cfg.post_norms else _LAYER_NAMES
        for hf_name in self.index:
            short = _TOP_NAMES.get(hf_name)
            m = _LAYER_RE.match(hf_name)
            if short is None and m and m.group(2) in names:
                short = f"blk.{m.group(1)}.{names[m.group(2)]}"
            elif short is None and m and (found := expert_of(m.group(2))):
                short = f"blk.{m.group(1)}.ffn_{found[1]}.{found[0]}"
            if short is not None:
                renamed[short] = hf_name
        # Gemma's checkpoints store norm weights as w - 1 (its RMSNorm multiplies by 1 + w).
        offset = np.float32(1.0 if cfg.arch in ("gemma", "gemma2", "gemma3") else 0.0)

        def get(name: str, kind: str) -> Matrix | list[Matrix] | npt.NDArray[np.float32] | None:
            if kind == "stack":
                return stack(name)
            hf_name = renamed.get(name)
            if hf_name is None:
                return None
            arr = self.index[hf_name].tensor(hf_name)
            if cfg.arch == "ernie4_5" and name.endswith(("attn_q", "attn_k", "q.bias", "k.bias")):
                # (2i, 2i + 1) pairs to rotate-half order, as for its GGUF rows above.
                arr = unpermute_rope_rows(arr, cfg.n_heads if "attn_q" in name else cfg.n_kv_heads)
            if kind == "vector":
                return arr.reshape(-1) + offset if name.endswith("norm") else arr.reshape(-1)
            if arr.ndim != 2:
                raise WeightFormatError(f"tensor {hf_name} is not a matrix: shape {arr.shape}")
            return DenseMatrix(arr)

        def stack(name: str) -> list[Matrix] | None:
            """An expert stack ``[n, rows, cols]`` as one matrix an expert; Granite MoE's gate
            and up halves of its ``input_linear``."""
            hf_name = renamed.get(name)
            half = None
            if hf_name is None and name.endswith(("ffn_gate_exps", "ffn_up_exps")):
                hf_name = renamed.get(name.rsplit(".", 1)[0] + ".ffn_gate_up_exps")
                half = 0 if name.endswith("ffn_gate_exps") else 1
            if hf_name is None:
                return None
            arr = self.index[hf_name].tensor(hf_name)
            if half is not None:
                arr = np.split(arr, 2, axis=1)[half]
            return [DenseMatrix(np.ascontiguousarray(m)) for m in arr]

        return LlamaWeights.gather(cfg, get, where=str(self.files[0].path), on_progress=on_progress)
