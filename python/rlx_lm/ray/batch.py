"""Batch generation over a Ray Dataset, on a pool of actors that each hold one runner.

Every row is generated on its own, with a sampler chain keyed by
``(seed, sequence_id=row_sequence_id(row id), step)``: a row's text depends only
on its prompt, the options, the seed and its id, never on which actor ran it,
how the dataset was split into blocks, or in which order rows arrived. The
prompt cache is not used here, because a cached prefix and a fresh prefill may
round differently and a row must not depend on what its actor ran before.

Faults are Ray's: actors are restarted without limit and a batch whose actor
died is run again (``max_restarts=-1``, ``max_task_retries=-1``). A batch's
output is committed only when the batch finishes, so a retried batch is
neither lost nor duplicated.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx_lm.errors import InvalidOptionError
from rlx_lm.sample_opts import SampleOpts

if TYPE_CHECKING:
    import ray.data

__all__ = ["generate", "row_sequence_id"]

_U64 = (1 << 64) - 1


def row_sequence_id(row_id: object) -> int:
    """A row's sampler sequence id: an integer id itself, else a stable 64-bit hash of it."""
    if isinstance(row_id, (bool, np.bool_)):
        raise InvalidOptionError(f"row ids must be integers or strings, got {row_id!r}")
    if isinstance(row_id, (int, np.integer)):
        return int(row_id) & _U64
    if isinstance(row_id, bytes):
        data = row_id
    elif isinstance(row_id, str):
        data = row_id.encode()
    else:
        raise InvalidOptionError(
            f"row ids must be integers or strings, got {type(row_id).__name__}"
        )
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class _Generate:
    """One actor of the pool: loads the model once, then generates each batch row by row."""

    def __init__(self, model: str | None, config: Mapping[str, Any]) -> None:
        from rlx_lm.default_model import load_default
        from rlx_lm.generation import load_model

        load = dict(config["load"])
        if model is None:
            self.runner, self.tokenizer = load_default(**load)
        else:
            self.runner, self.tokenizer = load_model(model, **load)
        self.config = config

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        from rlx_lm.generation import generate as generate_one

        cfg = self.config
        ids = batch[cfg["id_column"]]
        prompts = batch.get(cfg["prompt_column"])
        messages = batch.get(cfg["messages_column"])
        texts: list[str] = []
        tokens: list[list[int]] = []
        reasons: list[str] = []
        prompt_tokens: list[int] = []
        logprobs: list[list[float]] = []
        for i, row_id in enumerate(ids):
            prompt: str | list[int]
            if messages is not None and messages[i] is not None:
                prompt = self._chat(messages[i])
            elif prompts is not None:
                prompt = str(prompts[i])
            else:
                raise InvalidOptionError(
                    f"row {row_id!r} has neither a {cfg['prompt_column']!r} nor a "
                    f"{cfg['messages_column']!r} column"
                )
            result = generate_one(
                self.runner,
                self.tokenizer,
                prompt,
                opts=cfg["opts"],
                seed=cfg["seed"],
                max_tokens=cfg["max_tokens"],
                stop=cfg["stop"],
                logprobs=cfg["logprobs"],
                sequence_id=row_sequence_id(row_id.item() if hasattr(row_id, "item") else row_id),
            )
            texts.append(result.text)
            tokens.append([int(t) for t in result.tokens])
            reasons.append(result.stop_reason)
            prompt_tokens.append(result.prompt_tokens)
            if result.logprobs is not None:
                logprobs.append([lp.logprob for lp in result.logprobs])
        out: dict[str, Any] = {
            cfg["id_column"]: ids,
            "text": texts,
            "tokens": tokens,
            "stop_reason": reasons,
            "prompt_tokens": prompt_tokens,
        }
        if cfg["logprobs"] is not None:
            out["logprobs"] = logprobs
        return out

    def _chat(self, messages: Any) -> list[int]:
        apply = getattr(self.tokenizer, "apply_chat_template", None)
        if apply is None:
            raise InvalidOptionError("this tokenizer has no chat template support")
        turns = [dict(m) for m in messages]
        return [int(t) for t in apply(turns, add_generation_prompt=True, tokenize=True)]


def _as_dataset(data: Any, prompt_column: str, id_column: str) -> ray.data.Dataset:
    import ray.data

    if isinstance(data, ray.data.Dataset):
        return data
    if isinstance(data, (str, bytes)) or not isinstance(data, Sequence):
        raise InvalidOptionError(
            "dataset must be a ray.data.Dataset or a sequence of prompts, got "
            f"{type(data).__name__}"
        )
    rows = []
    for i, item in enumerate(data):
        if isinstance(item, str):
            rows.append({id_column: i, prompt_column: item})
        elif isinstance(item, Mapping):
            rows.append({id_column: i, **item})
        else:
            raise InvalidOptionError(
                f"item {i} must be a prompt string or a row mapping, got {type(item).__name__}"
            )
    return ray.data.from_items(rows)


def generate(
    dataset: ray.data.Dataset | Sequence[str] | Sequence[Mapping[str, Any]],
    *,
    model: str | os.PathLike[str] | None = None,
    opts: SampleOpts | None = None,
    seed: int = 0,
    max_tokens: int = 128,
    stop: Sequence[str] = (),
    logprobs: int | None = None,
    prompt_column: str = "prompt",
    messages_column: str = "messages",
    id_column: str = "id",
    num_actors: int = 1,
    batch_size: int = 16,
    threads: int = 1,
    num_cpus: float | None = None,
    load_kwargs: Mapping[str, Any] | None = None,
) -> ray.data.Dataset:
    """Generate a completion for every row of ``dataset`` on ``num_actors`` actors.

    Rows carry a prompt string in ``prompt_column`` or chat messages (a list of
    ``{"role", "content"}`` mappings) in ``messages_column``, and an id in
    ``id_column`` (an integer or a string, unique per row). A plain list of
    prompts is accepted too; its ids are the positions. ``model`` is a path
    every actor can read (None: the bundled default model). Each actor loads
    the model once with ``threads`` compute threads and reserves ``num_cpus``
    CPUs (default: ``threads``).

    Returns a lazy Dataset, in the input's row order, with the columns ``id_column``,
    ``text``, ``tokens``, ``stop_reason``, ``prompt_tokens`` and, with
    ``logprobs``, the chosen tokens' log-probabilities.
    """
    if num_actors < 1:
        raise InvalidOptionError(f"num_actors must be >= 1, got {num_actors}")
    if batch_size < 1:
        raise InvalidOptionError(f"batch_size must be >= 1, got {batch_size}")
    if threads < 1:
        raise InvalidOptionError(f"threads must be >= 1, got {threads}")
    if max_tokens < 0:
        raise InvalidOptionError(f"max_tokens must be >= 0, got {max_tokens}")
    if opts is not None and not isinstance(opts, SampleOpts):
        raise InvalidOptionError(f"opts must be a SampleOpts, got {type(opts).__name__}")
    model_path = None if model is None else str(Path(model).resolve())
    load = dict(load_kwargs or {})
    load.setdefault("threads", threads)
    config = {
        "load": load,
        "opts": opts,
        "seed": int(seed),
        "max_tokens": int(max_tokens),
        "stop": tuple(stop),
        "logprobs": logprobs,
        "prompt_column": prompt_column,
        "messages_column": messages_column,
        "id_column": id_column,
    }
    ds = _as_dataset(dataset, prompt_column, id_column)
    out = ds.map_batches(
        _Generate,
        fn_constructor_kwargs={"model": model_path, "config": config},
        batch_size=batch_size,
        batch_format="numpy",
        concurrency=num_actors,
        num_cpus=float(threads if num_cpus is None else num_cpus),
        max_restarts=-1,
        max_task_retries=-1,
    )
    # Rows leave in the order they came in, without a shuffle: a sort would
    # cost a full exchange of the results for an order the input already has.
    out.context.execution_options.preserve_order = True
    return out
