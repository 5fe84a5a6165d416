"""generate/stream: sampling, stop conditions, streaming text, events, logprobs, prompt cache."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from model_factory import make_tiny, write_gguf
from tokenizer_factory import spm_gguf_fields, spm_vocab

from rlx_lm import PromptCache, SampleOpts
from rlx_lm.generation import GenerationEvent, generate, stream
from rlx_lm.runners.llama import LlamaRunner, load_llama
from rlx_lm.tokenizer import Tokenizer

TOKENS, _, _ = spm_vocab()
EOS = 2


class Scripted:
    """A runner without a decode pair whose greedy continuation is a fixed script of tokens."""

    family = "scripted"

    def __init__(self, script: Sequence[int], prompt_len: int, vocab: int) -> None:
        self.script = list(script)
        self.prompt_len = prompt_len
        self.vocab_size = vocab

    def predict_logits(self, prompt_ids: Sequence[int], /) -> np.ndarray:
        step = len(prompt_ids) - self.prompt_len
        logits = np.zeros(self.vocab_size, dtype=np.float32)
        logits[self.script[min(step, len(self.script) - 1)]] = 10.0
        return logits


class ScriptedWithPair(Scripted):
    """The same script, with its own prefill/decode pair."""

    def prefill_logits(self, prompt_ids: Sequence[int], /) -> np.ndarray:
        self.ctx = list(prompt_ids)
        return self.predict_logits(self.ctx)

    def decode_logits(self, token: int, /) -> np.ndarray:
        self.ctx.append(token)
        return self.predict_logits(self.ctx)


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gen") / "m.gguf"
    return write_gguf(
        make_tiny("llama", seed=8, vocab=len(TOKENS)), path, tokenizer=spm_gguf_fields()
    )


@pytest.fixture(scope="module")
def tok(spm_model: Path) -> Tokenizer:
    return Tokenizer.load(spm_model)


def _script(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_greedy_generation_matches_the_runners_own_greedy_loop(
    spm_model: Path, tok: Tokenizer
) -> None:
    runner = load_llama(spm_model, max_seq=64)
    prompt = tok.encode("hello world")
    want = runner.generate(prompt, 12)
    res = generate(runner, tok, "hello world", max_tokens=12)
    stop_at = next((i for i, t in enumerate(want) if t == EOS), len(want))
    assert res.tokens == want[:stop_at]
    assert res.text == tok.decode(res.tokens)
    assert res.stop_reason == ("eos" if stop_at < len(want) else "length")
    assert res.prompt_tokens == len(prompt)


@pytest.mark.parametrize("runner_cls", [Scripted, ScriptedWithPair])
def test_eos_stops_and_is_not_emitted(tok: Tokenizer, runner_cls: type[Scripted]) -> None:
    prompt = tok.encode("the")
    script = [*_script(tok, "cat sat"), EOS, *_script(tok, "on the mat")]
    res = generate(runner_cls(script, len(prompt), len(TOKENS)), tok, prompt, max_tokens=20)
    assert res.text == " cat sat"
    assert res.stop_reason == "eos"
    assert EOS not in res.tokens


def test_stop_strings_are_never_emitted_even_across_tokens(tok: Tokenizer) -> None:
    prompt = tok.encode("the")
    script = _script(tok, "cat sat on the mat")
    runner = Scripted(script, len(prompt), len(TOKENS))
    pieces = []
    gen = stream(runner, tok, prompt, max_tokens=20, stop=["on th", "zzz"])
    for chunk in gen:
        pieces.append(chunk.text)
    assert "".join(pieces) == " cat sat "
    assert gen.result.text == " cat sat "
    assert gen.result.stop_reason == "stop"
    # a stop string that never occurs holds nothing back at the end
    res = generate(runner, tok, prompt, max_tokens=len(script), stop=["mats"])
    assert res.text == " cat sat on the mat"
    assert res.stop_reason == "length"


def test_max_tokens_and_streamed_text_add_up(tok: Tokenizer) -> None:
    prompt = tok.encode("hello")
    script = _script(tok, "world 😀 é the end")
    runner = ScriptedWithPair(script, len(prompt), len(TOKENS))
    gen = stream(runner, tok, prompt, max_tokens=len(script))
    chunks = list(gen)
    assert "".join(c.text for c in chunks) == " world 😀 é the end"
    assert all("\ufffd" not in c.text for c in chunks)
    assert len(gen.result.tokens) == len(script)
    assert generate(runner, tok, prompt, max_tokens=3).tokens == script[:3]
    assert generate(runner, tok, prompt, max_tokens=0).tokens == []


def test_events_report_every_phase_in_order(spm_model: Path, tok: Tokenizer) -> None:
    runner = load_llama(spm_model, max_seq=64, chunk=2)
    events: list[GenerationEvent] = []
    prompt = tok.encode("hello world the cat")
    res = generate(runner, tok, prompt, max_tokens=4, on_event=events.append)
    phases = [e.phase for e in events]
    prefill = [(e.done, e.total) for e in events if e.phase == "prefill"]
    n = len(prompt)
    assert prefill[0] == (0, n)
    assert prefill[-1] == (n, n)
    assert any(0 < d < n for d, _ in prefill), "chunked prefill reports progress k/n"
    assert phases.count("decode") == len(res.tokens)
    assert phases[-1] == "stop"
    assert events[-1].detail == res.stop_reason


def test_same_seed_same_tokens_different_seed_differs(spm_model: Path, tok: Tokenizer) -> None:
    runner = load_llama(spm_model, max_seq=64)
    opts = SampleOpts(temperature=1.5)
    runs = [
        generate(runner, tok, "hello", opts=opts, seed=s, max_tokens=16).tokens for s in (1, 1, 2)
    ]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_logprobs_are_the_log_softmax_of_the_logits(spm_model: Path, tok: Tokenizer) -> None:
    runner = load_llama(spm_model, max_seq=64)
    prompt = tok.encode("hello")
    res = generate(runner, tok, prompt, max_tokens=3, logprobs=3)
    assert res.logprobs is not None
    assert len(res.logprobs) == len(res.tokens)
    logits = runner.predict_logits(prompt).astype(np.float64)
    logsm = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    first = res.logprobs[0]
    assert first.token == res.tokens[0] == int(np.argmax(logits))
    assert first.logprob == pytest.approx(logsm[first.token], abs=1e-4)
    assert [t for t, _ in first.top] == list(np.argsort(-logsm, kind="stable")[:3])


def test_prompt_cache_reuses_a_prefix_and_changes_nothing(spm_model: Path, tok: Tokenizer) -> None:
    runner = load_llama(spm_model, max_seq=64)
    cache = PromptCache(64 * 1024 * 1024)
    runner.attach_prompt_cache(cache)
    assert runner.kv_store_stats() == (0, 0, 0)
    first = generate(runner, tok, "hello world the", max_tokens=6, prompt_cache=cache)
    events: list[GenerationEvent] = []
    second = generate(
        runner, tok, "hello world the cat", max_tokens=6, prompt_cache=cache, on_event=events.append
    )
    fresh = generate(load_llama(spm_model, max_seq=64), tok, "hello world the cat", max_tokens=6)
    assert second.tokens == fresh.tokens
    assert second.reused_tokens > 0
    assert any(e.phase == "cache_lookup" and e.detail == "hit" for e in events)
    assert first.reused_tokens == 0
    blocks, tokens, disk = runner.kv_store_stats() or (0, 0, 0)
    assert (blocks, tokens, disk) == cache.kv_store_stats()
    assert tokens > 0
    assert blocks > 0


def test_runner_type_is_the_reference_runner(spm_model: Path) -> None:
    assert isinstance(load_llama(spm_model), LlamaRunner)


def test_load_model_builds_through_the_registry_and_reports_load(spm_model: Path) -> None:
    from rlx_lm.errors import InvalidOptionError
    from rlx_lm.generation import load_model

    events: list[GenerationEvent] = []
    runner, tok = load_model(spm_model, on_event=events.append, max_seq=40)
    assert isinstance(runner, LlamaRunner)
    assert runner.max_seq == 40
    assert tok.eos_ids == {EOS}
    # a start event, then the engine's three load steps through load_progress
    assert [(e.phase, e.done, e.total) for e in events] == [
        ("load", 0, 1),
        ("load", 1, 3),
        ("load", 2, 3),
        ("load", 3, 3),
    ]
    with pytest.raises(InvalidOptionError, match="no_such_setting"):
        load_model(spm_model, no_such_setting=1)


def test_logprob_mode_reaches_the_chain(spm_model: Path, tok: Tokenizer) -> None:
    # after top-k 1 only the argmax survives, so its final-distribution logprob is 0
    runner = load_llama(spm_model, max_seq=64)
    opts = SampleOpts(top_k=1)
    final = generate(
        runner, tok, "hello", opts=opts, max_tokens=2, logprobs=1, logprob_mode="final"
    )
    raw = generate(runner, tok, "hello", opts=opts, max_tokens=2, logprobs=1)
    assert final.logprobs is not None
    assert raw.logprobs is not None
    assert all(lp.logprob == pytest.approx(0.0, abs=1e-6) for lp in final.logprobs)
    assert all(lp.logprob < 0 for lp in raw.logprobs)


def test_public_names_are_exported() -> None:
    import rlx_lm

    assert rlx_lm.generate is generate
    assert rlx_lm.stream is stream
    assert rlx_lm.Tokenizer is Tokenizer
