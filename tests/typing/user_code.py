"""User code: the runner load_default / load_model return has generate, under mypy --strict."""

from __future__ import annotations

from rlx_lm import load_default, load_model


def first_tokens() -> list[int]:
    runner, tokenizer = load_default()
    ids = tokenizer.encode("hello")
    return runner.generate(ids, 4, lambda _token: True)


def from_a_file(path: str) -> int:
    runner, _ = load_model(path, max_seq=64)
    return len(runner.generate([1, 2], 2)) + runner.vocab_size
