"""Find Llama-family safetensors: one file, sharded Hugging Face dirs, plain MLX dirs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlx_lm._headers import SAFETENSORS_INDEX, load_json, read_safetensors_index
from rlx_lm.errors import WeightFormatError

__all__ = ["locate_safetensors", "read_config_json"]


def read_config_json(path: Path) -> dict[str, Any]:
    """Parse a ``config.json``, raising WeightFormatError with the path on failure."""
    try:
        data = load_json(path.read_bytes(), path, "config.json")
    except FileNotFoundError:
        raise WeightFormatError(
            f"{path}: no config.json (needed for safetensors weights)"
        ) from None
    except OSError as exc:
        raise WeightFormatError(f"{path}: unreadable config.json: {exc}") from None
    if not isinstance(data, dict):
        raise WeightFormatError(f"{path}: config.json is not a JSON object")
    return data


def locate_safetensors(path: Path) -> tuple[list[Path], Path | None]:
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
        return files, cfg if cfg.is_file() else None
    if not path.is_file():
        raise WeightFormatError(f"{path}: no such file or directory")
    cfg = path.parent / "config.json"
    return [path], cfg if cfg.is_file() else None
