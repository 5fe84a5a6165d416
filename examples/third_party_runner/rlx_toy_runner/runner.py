"""A bigram language model read from a GGUF file: next-token logits are a table row."""

from __future__ import annotations

import os
from collections.abc import Sequence

import gguf
import numpy as np
import numpy.typing as npt

ARCHITECTURE = "rlxtoy"
TABLE = "toy.bigram"


class ToyRunner:
    """Logits for the next token are ``table[last token]``; it has a cached decode pair."""

    family = ARCHITECTURE

    def __init__(self, path: str | os.PathLike[str], max_seq: int = 128) -> None:
        reader = gguf.GGUFReader(path)
        arch = reader.get_field("general.architecture")
        # ReaderField.contents() is gguf>=0.14; the parts/data form works from 0.10 on.
        name = None if arch is None else bytes(arch.parts[arch.data[0]]).decode("utf-8")
        if name != ARCHITECTURE:
            raise ValueError(f"{path}: not a {ARCHITECTURE} GGUF")
        tables = [t for t in reader.tensors if t.name == TABLE]
        if not tables:
            raise ValueError(f"{path}: no {TABLE} tensor")
        self.table: npt.NDArray[np.float32] = np.array(tables[0].data, dtype=np.float32)
        self.max_seq = max_seq
        self._last: int | None = None
        self._length = 0

    @property
    def vocab_size(self) -> int:
        return int(self.table.shape[0])

    def predict_logits(self, prompt_ids: Sequence[int]) -> npt.NDArray[np.float32]:
        if not prompt_ids:
            raise ValueError("empty prompt")
        return self.table[prompt_ids[-1]].copy()

    def prefill_logits(self, prompt_ids: Sequence[int]) -> npt.NDArray[np.float32]:
        logits = self.predict_logits(prompt_ids)
        self._last, self._length = int(prompt_ids[-1]), len(prompt_ids)
        return logits

    def decode_logits(self, token: int) -> npt.NDArray[np.float32]:
        if self._last is None:
            raise RuntimeError("decode before prefill")
        if self._length >= self.max_seq:
            raise RuntimeError(f"sequence longer than max_seq={self.max_seq}")
        self._last, self._length = int(token), self._length + 1
        return self.table[token].copy()


def write_toy_gguf(path: str | os.PathLike[str], vocab: int = 8, seed: int = 0) -> None:
    """Write a random bigram table as a GGUF file this runner loads."""
    table = np.random.default_rng(seed).standard_normal((vocab, vocab)).astype(np.float32)
    writer = gguf.GGUFWriter(os.fspath(path), ARCHITECTURE)
    writer.add_tensor(TABLE, table)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
