"""Reasoning replies end to end: gpt-oss's harmony format (its own chat template, its
end-of-turn tokens, its channels told apart) and think tags, through `ChatSession` and through
the OpenAI-compatible server (``reasoning_content``, streamed and whole: in
tests/test_server.py, with the other tests that drive it through the openai client)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from model_factory import make_tiny, write_gguf
from tokenizer_factory import bpe_gguf_fields, train_bpe

from rlx_lm.chat import ChatSession
from rlx_lm.errors import ChatTemplateError
from rlx_lm.tokenizer import Tokenizer

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
TRAINED = train_bpe()
HARMONY = [
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|constrain|>",
]


def _gguf(tmp: Path, added: list[str], types: list[int], template: str) -> Path:
    """The trained BPE with ``added`` tokens (GGUF ``types``) and a chat template."""
    fields = bpe_gguf_fields(TRAINED, add_bos=False)
    fields["tokenizer.ggml.tokens"] = [*fields["tokenizer.ggml.tokens"], *added]
    fields["tokenizer.ggml.token_type"] = [*fields["tokenizer.ggml.token_type"], *types]
    fields["tokenizer.chat_template"] = template
    vocab = len(fields["tokenizer.ggml.tokens"])
    return write_gguf(make_tiny(vocab=vocab), tmp / "m.gguf", tokenizer=fields)


@pytest.fixture
def harmony(tmp_path: Path) -> Tokenizer:
    template = (TEMPLATES / "gpt-oss.jinja").read_text(encoding="utf-8")
    return Tokenizer.load(_gguf(tmp_path, HARMONY, [3] * len(HARMONY), template))


class Scripted:
    """Greedy continuation of any prompt: ``script`` (token ids), then its last token."""

    family = "scripted"

    def __init__(self, vocab: int, script: list[int]) -> None:
        self.vocab_size = vocab
        self.script = script
        self.start = 0
        self.max_seq = 4096

    def predict_logits(self, ids: Any) -> np.ndarray:
        logits = np.zeros(self.vocab_size, dtype=np.float32)
        at = max(0, len(ids) - self.start)
        logits[self.script[min(at, len(self.script) - 1)]] = 80.0  # certain at any temperature
        return logits


def _ids(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


REPLY = (
    "<|channel|>analysis<|message|>The user asks for a capital.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Paris.<|return|>"
)


def test_harmony_ends_a_turn_at_return_and_call_not_at_end(harmony: Tokenizer) -> None:
    tid = {t: harmony.inner.token_to_id(t) for t in HARMONY}
    assert {tid["<|return|>"], tid["<|call|>"]} <= harmony.stop_token_ids
    assert tid["<|end|>"] not in harmony.stop_token_ids
    # Its markup is kept in decoded text (so the channels can be told apart), its closers not.
    ids = _ids(harmony, REPLY)
    assert harmony.decode(ids) == REPLY.replace("<|end|>", "").replace("<|return|>", "")


def test_user_defined_tokens_are_text_and_control_tokens_are_not(tmp_path: Path) -> None:
    """As llama.cpp decodes a GGUF's added tokens: ``<think>`` (user-defined in Qwen3's files)
    is text, a control token (``<|im_end|>``) is not; both are matched whole in encoding."""
    tok = Tokenizer.load(
        _gguf(tmp_path, ["<think>", "</think>", "<|im_end|>"], [4, 4, 3], "{{ messages }}")
    )
    text = "<think>hmm</think>ok<|im_end|>"
    ids = _ids(tok, text)
    assert [tok.inner.token_to_id(t) for t in ("<think>", "</think>", "<|im_end|>")] == [
        i for i in ids if i >= len(TRAINED.get_vocab())
    ]
    assert tok.decode(ids) == "<think>hmm</think>ok"
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_the_gpt_oss_template_renders_openais_documented_prompt(harmony: Tokenizer) -> None:
    msgs = [
        {"role": "system", "content": "Always respond in riddles"},
        {"role": "user", "content": "What is the weather like in SF?"},
    ]
    today = datetime.now().strftime("%Y-%m-%d")
    text = harmony.apply_chat_template(msgs, tokenize=False, reasoning_effort="high")
    # OpenAI's harmony guide: system message, developer instructions, the user, then the
    # assistant's turn opened for the model to pick a channel.
    assert text == (
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        f"Knowledge cutoff: 2024-06\nCurrent date: {today}\n\nReasoning: high\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every "
        "message.<|end|><|start|>developer<|message|># Instructions\n\n"
        "Always respond in riddles\n\n<|end|>"
        "<|start|>user<|message|>What is the weather like in SF?<|end|><|start|>assistant"
    )
    # A reply passed back with its channel markup in the content is refused by the template.
    bad = [*msgs, {"role": "assistant", "content": "<|channel|>final<|message|>x"}]
    with pytest.raises(ChatTemplateError, match="thinking"):
        harmony.apply_chat_template([*bad, {"role": "user", "content": "y"}], tokenize=False)


def test_a_requests_reasoning_effort_reaches_the_template(harmony: Tokenizer) -> None:
    from rlx_lm.server.protocol import Limits, ProtocolError, parse_chat

    limits = Limits("m", harmony.vocab_size, 64, 1, 5)
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}]}

    def prompt(**extra: Any) -> str:
        parsed = parse_chat(body | extra, harmony, limits)
        return harmony.decode(list(parsed.requests[0].prompt), skip_special_tokens=False)

    assert "Reasoning: medium" in prompt(), "the template's default"
    assert "Reasoning: high" in prompt(reasoning_effort="high")
    # chat_template_kwargs, the more specific, wins.
    kw = {"reasoning_effort": "low"}
    assert "Reasoning: low" in prompt(reasoning_effort="high", chat_template_kwargs=kw)
    with pytest.raises(ProtocolError, match="reasoning_effort"):
        prompt(reasoning_effort="extreme")


def test_a_chat_keeps_the_answer_and_sets_the_reasoning_apart(harmony: Tokenizer) -> None:
    runner = Scripted(harmony.vocab_size, _ids(harmony, REPLY))
    chat = ChatSession(runner, harmony, max_tokens=64)
    runner.start = len(chat.prompt_ids("Capital of France?"))
    answer: list[str] = []
    thought: list[str] = []
    res = chat.send("Capital of France?", on_text=answer.append, on_reasoning=thought.append)
    assert res.stop_reason == "eos", "<|return|> ends the turn; <|end|> did not"
    assert ("".join(thought), "".join(answer)) == ("The user asks for a capital.", "Paris.")
    assert chat.messages[-1] == {
        "role": "assistant",
        "content": "Paris.",
        "reasoning_content": "The user asks for a capital.",
    }
    # The next turn renders (the template would refuse channel markup in the content).
    assert "<|start|>assistant<|channel|>final<|message|>Paris.<|end|>" in str(
        harmony.apply_chat_template(
            [*chat.messages, {"role": "user", "content": "Why?"}], tokenize=False
        )
    )
    whole = ChatSession(Scripted(harmony.vocab_size, runner.script), harmony, max_tokens=64)
    whole.runner.start = runner.start  # type: ignore[attr-defined]
    whole.reasoning_format = "none"
    got = whole.send("Capital of France?")
    assert got.text == REPLY.replace("<|end|>", "").replace("<|return|>", "")


THINK = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant: <think>"
