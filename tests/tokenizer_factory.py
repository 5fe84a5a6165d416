"""Tiny tokenizers for tests: a trained byte-level BPE and a hand-made SentencePiece vocabulary.

Both come with the ``tokenizer.ggml.*`` fields llama.cpp would write for them, and the
SentencePiece one with a plain-Python reference of llama.cpp's SPM algorithm to test against.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS = [
    "the cat sat on the mat and the hat",
    "hello world, hello there! the world is round.",
    "numbers 123 4567 and symbols #@! plus café naïve 日本語 😀",
    "Streaming text token by token, never splitting a character.",
] * 20

BOS, EOS = "<|bos|>", "<|eos|>"


def train_bpe(vocab_size: int = 300) -> Tokenizer:
    """A GPT-2 style byte-level BPE trained on CORPUS, with BOS/EOS as special tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def bpe_gguf_fields(tok: Tokenizer, *, add_bos: bool = True) -> dict[str, Any]:
    """The ``tokenizer.ggml.*`` fields llama.cpp's converter writes for a gpt2-style BPE."""
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [3 if t in (BOS, EOS) else 1 for t in tokens]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": vocab[BOS],
        "tokenizer.ggml.eos_token_id": vocab[EOS],
        "tokenizer.ggml.add_bos_token": add_bos,
    }


_WORDS = ["▁the", "▁and", "▁hello", "▁world", "▁cat", "▁hat", "▁sat", "▁on", "▁mat", "ing", "▁is"]


def spm_vocab(seed: int = 0) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores, types of a llama-style SentencePiece vocabulary (distinct scores)."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    pieces: list[str] = []
    for w in _WORDS:
        for n in range(1, len(w) + 1):
            for i in range(len(w) - n + 1):
                s = w[i : i + n]
                if s not in pieces:
                    pieces.append(s)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(pieces))
    # Longer pieces score higher, plus a random, distinct tie-break.
    piece_scores = [float(len(p)) + float(order[i]) / len(pieces) for i, p in enumerate(pieces)]
    scores = [0.0] * len(tokens) + piece_scores
    return tokens + pieces, scores, types + [1] * len(pieces)


def spm_gguf_fields() -> dict[str, Any]:
    """The ``tokenizer.ggml.*`` fields of the hand-made SentencePiece vocabulary."""
    tokens, scores, types = spm_vocab()
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
    }


def spm_reference_encode(
    text: str, tokens: list[str], scores: list[float], *, space_prefix: bool = True
) -> list[int]:
    """llama.cpp's SPM tokenizer, plainly: merge the best-scoring adjacent pair until none is
    in the vocabulary; unknown symbols become their UTF-8 bytes' ``<0xNN>`` tokens."""
    if not text:
        return []
    vocab = {t: i for i, t in enumerate(tokens)}
    symbols = list(("▁" if space_prefix else "") + text.replace(" ", "▁"))
    while True:
        best = None
        for i in range(len(symbols) - 1):
            merged = symbols[i] + symbols[i + 1]
            if merged in vocab and (best is None or scores[vocab[merged]] > best[0]):
                best = (scores[vocab[merged]], i)
        if best is None:
            break
        i = best[1]
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
    ids: list[int] = []
    for s in symbols:
        if s in vocab:
            ids.append(vocab[s])
        else:
            ids.extend(vocab[f"<0x{b:02X}>"] for b in s.encode())
    return ids
