"""``rlx-lm bench`` and `rlx_lm.bench`: llama-bench's pp/tg tests on a model file."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from rlx_lm import InvalidOptionError, UnsupportedError
from rlx_lm.bench import BenchResult, _Timer, bench_model, format_json, format_markdown
from rlx_lm.cli import main
from rlx_lm.default_model import default_model_path


class _Counting:
    """A runner that records what the timer asks of it."""

    vocab_size = 50

    def __init__(self) -> None:
        self.prefills: list[list[int]] = []
        self.decodes: list[int] = []

    def prefill_logits(self, ids: list[int]) -> Any:
        self.prefills.append(list(ids))
        return np.zeros(self.vocab_size, np.float32)

    def decode_logits(self, tok: int) -> Any:
        self.decodes.append(tok)
        return np.zeros(self.vocab_size, np.float32)


def test_pp_is_one_prefill_and_tg_one_token_at_a_time() -> None:
    runner = _Counting()
    timer = _Timer(runner)
    assert timer.pp(7) > 0
    assert [len(p) for p in runner.prefills] == [7]
    assert not runner.decodes
    assert timer.tg(5) > 0
    assert [len(p) for p in runner.prefills] == [7, 1]  # the first token from an empty context
    assert len(runner.decodes) == 4
    assert all(0 <= t < runner.vocab_size for t in runner.decodes)


def test_bench_model_runs_every_test_of_every_configuration() -> None:
    seen: list[BenchResult] = []
    rows = bench_model(
        default_model_path(),
        prompts=[16, 0],
        gens=[4],
        threads=[1, 2],
        reps=2,
        on_result=seen.append,
    )
    assert seen == rows
    assert [(r.threads, r.test, r.n_tokens) for r in rows] == [
        (1, "pp16", 16),
        (1, "tg4", 4),
        (2, "pp16", 16),
        (2, "tg4", 4),
    ]
    for r in rows:
        assert len(r.samples) == 2
        assert all(math.isfinite(s) and s > 0 for s in r.samples)
        assert r.activations == "exact"
        assert r.size_bytes == default_model_path().stat().st_size


@pytest.mark.parametrize(
    ("kw", "what"),
    [
        ({"threads": [0]}, "threads"),
        ({"reps": 0}, "reps"),
        ({"prompts": [-1]}, "prompts"),
        ({"gens": [-3]}, "gens"),
        ({"prompts": [0], "gens": [0]}, "nothing to run"),
    ],
)
def test_bad_settings_are_refused_by_name(kw: dict[str, Any], what: str) -> None:
    with pytest.raises(InvalidOptionError, match=what):
        bench_model(default_model_path(), **kw)


def test_the_table_and_json_show_mean_and_spread() -> None:
    r = BenchResult("m.gguf", 3 * 2**20, 2, "q8", "tg128", 128, (1.0, 3.0))
    table = format_markdown([r])
    assert table.splitlines()[0] == "| model | size | threads | activations | test | t/s |"
    assert table.splitlines()[-1] == "| m.gguf | 3.00 MiB | 2 | q8 | tg128 | 2.00 ± 1.41 |"
    (item,) = json.loads(format_json([r]))
    assert item["avg_ts"] == 2.0
    assert item["stddev_ts"] == pytest.approx(math.sqrt(2))
    assert item["samples"] == [1.0, 3.0]
    assert BenchResult("m", 1, 1, "exact", "pp1", 1, (5.0,)).stdev == 0.0


def test_the_bench_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "-p", "8,16", "-n", "4", "-r", "2", "-t", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| model |")
    assert [line.split("|")[5].strip() for line in out[2:]] == ["pp8", "pp16", "tg4"]
    assert (
        main(["bench", "-p", "0", "-n", "2", "-r", "1", "-o", "json", "--activations", "q8"]) == 0
    )
    (item,) = json.loads(capsys.readouterr().out)
    assert (item["test"], item["activations"]) == ("tg2", "q8")
    assert main(["bench", "--activations", "fast"]) == 2
    assert "--activations" in capsys.readouterr().err
    assert main(["bench", "-r", "0"]) == 2
    assert "reps" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "-p", "1,x"])
    assert "expected numbers" in capsys.readouterr().err


def test_batched_generation_is_one_decode_batch_of_b_tokens_a_step(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlx_lm.runners.llama import LlamaRunner

    steps: list[int] = []
    real = LlamaRunner.decode_batch

    def spy(self: LlamaRunner, sessions: Any, tokens: Any) -> Any:
        steps.append(len(tokens))
        return real(self, sessions, tokens)

    monkeypatch.setattr(LlamaRunner, "decode_batch", spy)
    rows = bench_model(default_model_path(), prompts=[0], gens=[5], batches=[3], reps=1)
    assert [r.test for r in rows] == ["tg5", "tg5 x3"]
    assert steps == [3] * 4 * 2  # the warm-up and one rep, four steps after the first token
    assert main(["bench", "-p", "0", "-n", "2", "-b", "2,4", "-r", "1", "-t", "1"]) == 0
    tests = [line.split("|")[5].strip() for line in capsys.readouterr().out.splitlines()[2:]]
    assert tests == ["tg2", "tg2 x2", "tg2 x4"]
    with pytest.raises(InvalidOptionError, match="batches"):
        bench_model(default_model_path(), batches=[0])


def test_batched_generation_needs_a_runner_with_sessions() -> None:
    class Plain:
        family = "plain"
        vocab_size = 8
        max_seq = 16

        def predict_logits(self, ids: list[int]) -> Any:
            return np.zeros(self.vocab_size, np.float32)

        def prefill_logits(self, ids: list[int]) -> Any:  # a cached pair, but no sessions
            return self.predict_logits(ids)

        def decode_logits(self, token: int) -> Any:
            return self.predict_logits([token])

    with pytest.raises(UnsupportedError, match="no sessions"):
        _Timer(Plain()).batched(2)(3)
