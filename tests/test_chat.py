"""Multi-turn chat: ChatSession keeps the KV cache between turns; ``rlx-lm chat`` for real.

The REPL is driven as a user would: lines piped into the installed command, and a
pseudo-terminal (readline prompt, Ctrl-D), on the bundled model.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from model_factory import make_tiny, write_gguf
from test_chat_template import CHATML, chatml_fields

from rlx_lm import load_default
from rlx_lm.chat import ChatSession
from rlx_lm.cli import _parser, main
from rlx_lm.errors import CapacityError
from rlx_lm.generation import generate
from rlx_lm.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def bundled() -> tuple[Any, Tokenizer]:
    return load_default()


def test_each_turn_prefills_only_what_is_new(bundled: tuple[Any, Tokenizer]) -> None:
    runner, tok = bundled
    chat = ChatSession(runner, tok, system_prompt="A novel.", max_tokens=12)
    first = chat.send("Elizabeth said")
    prompt1 = chat.prompt_ids("x")  # turn 1 and its reply, then a new user turn
    second = chat.send("Mr. Darcy replied")
    assert first.reused_tokens == 0
    # Turn 2's prompt starts with turn 1's prompt and reply: those KV rows are reused.
    assert second.reused_tokens >= first.prompt_tokens
    assert second.reused_tokens >= second.prompt_tokens - 16  # the new turn, a few tokens
    assert len(prompt1) > first.prompt_tokens
    # ... and reusing them changes nothing: a fresh run on the same prompt agrees.
    fresh = generate(runner, tok, _turn2(chat), max_tokens=12)
    assert fresh.tokens == second.tokens
    assert [m["role"] for m in chat.messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
    ]


def _turn2(chat: ChatSession) -> list[int]:
    """The prompt turn 2 was generated from: the conversation before its reply."""
    return chat.tokenizer.apply_chat_template(chat.messages[:-1], chat_template=chat.chat_template)


def test_clear_starts_over_and_keeps_the_system_prompt(bundled: tuple[Any, Tokenizer]) -> None:
    runner, tok = bundled
    chat = ChatSession(runner, tok, system_prompt="A novel.", max_tokens=6)
    chat.send("Emma")
    chat.clear()
    assert chat.messages == [{"role": "system", "content": "A novel."}]
    again = chat.send("Emma")
    assert again.reused_tokens == 0, "the cache went with the conversation"


def test_a_conversation_longer_than_the_context_is_refused(
    bundled: tuple[Any, Tokenizer],
) -> None:
    runner, tok = bundled
    chat = ChatSession(runner, tok, max_tokens=4, context=20)
    with pytest.raises(CapacityError, match="/clear"):
        chat.send("word " * 40)
    assert chat.messages == [], "nothing is kept from a refused turn"


def test_a_template_models_reply_ends_at_its_end_of_turn_token(tmp_path: Path) -> None:
    fields = chatml_fields()
    n = len(fields["tokenizer.ggml.tokens"])
    tok = Tokenizer.load(write_gguf(make_tiny(vocab=n), tmp_path / "c.gguf", tokenizer=fields))
    im_end = n - 1
    hello = tok.encode("hello", add_special_tokens=False)

    class Replies:
        """Greedy continuation of the prompt: "hello", <|im_end|>, then "hello" forever."""

        family = "replies"
        vocab_size = n
        start = 0

        def predict_logits(self, ids: Any) -> np.ndarray:
            script = [*hello, im_end]
            logits = np.zeros(n, dtype=np.float32)
            logits[
                script[min(len(ids) - self.start, len(script) - 1)] if len(ids) >= self.start else 0
            ] = 9.0
            return logits

    runner = Replies()
    chat = ChatSession(runner, tok, max_tokens=10, context=512)
    runner.start = len(chat.prompt_ids("hi"))
    res = chat.send("hi")
    assert (res.text, res.stop_reason) == ("hello", "eos")
    assert chat.messages[-1] == {"role": "assistant", "content": "hello"}
    assert chat.prompt_ids("again") == tok.apply_chat_template(
        [*chat.messages, {"role": "user", "content": "again"}]
    )
    assert CHATML in (chat.chat_template.source if chat.chat_template else "")


# ------------------------------------------------------------------------- the command


def _cli(*args: str, stdin: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlx_lm.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_chat_command_with_piped_lines() -> None:
    proc = _cli(
        "chat", "-n", "8", "-v", "-sys", "A novel.",
        stdin="Elizabeth said\nand then\n/clear\nMr. Darcy\n/exit\nnever read\n",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    replies = proc.stdout.splitlines()
    assert len(replies) == 3, proc.stdout
    assert all(r.strip() for r in replies)
    assert "conversation cleared" in proc.stderr
    stats = [line for line in proc.stderr.splitlines() if line.startswith("[prompt")]
    assert len(stats) == 3
    assert " 0 reused" in stats[0]
    assert " 0 reused" not in stats[1], "turn 2 reuses turn 1's KV rows"
    assert " 0 reused" in stats[2], "/clear dropped them"


def test_chat_command_ends_cleanly_at_end_of_input() -> None:
    proc = _cli("chat", "-n", "4", stdin="Emma\n")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 1


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_chat_command_in_a_terminal_prompts_and_exits_on_ctrl_d() -> None:
    import pty  # noqa: F401  (POSIX only)

    leader, follower = os.openpty()
    env = dict(os.environ, TERM="dumb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlx_lm.cli", "chat", "-n", "6"],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=env,
        close_fds=True,
    )
    os.close(follower)
    seen = b""

    def read_until(marker: bytes, limit: float = 120) -> bytes:
        nonlocal seen
        end = time.monotonic() + limit
        while marker not in seen and time.monotonic() < end:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    seen += os.read(leader, 4096)
                except OSError:
                    break
        return seen

    try:
        assert b"> " in read_until(b"> "), seen
        before = len(seen)
        os.write(leader, b"Elizabeth said\r")
        read_until(b"> ", 120)
        while seen.count(b"> ") < 2 and proc.poll() is None:
            read_until(b"> ", 1)
        assert seen.count(b"> ") >= 2, seen
        assert len(seen) > before + len(b"Elizabeth said") + 4, "a reply was written"
        os.write(leader, b"\x04")  # Ctrl-D
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    assert b"Traceback" not in seen


# ------------------------------------------------------------- generate and templates


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    fields = chatml_fields()
    n = len(fields["tokenizer.ggml.tokens"])
    return write_gguf(
        make_tiny(vocab=n), tmp_path_factory.mktemp("cnv") / "c.gguf", tokenizer=fields
    )


def _prompt_tokens(err: str) -> int:
    line = next(x for x in err.splitlines() if x.startswith("prefill:"))
    return int(line.split()[1])


def test_cnv_parses_as_one_flag() -> None:
    args = _parser().parse_args(["generate", "-cnv", "-p", "x", "-sys", "be brief"])
    assert args.conversation is True
    assert args.ctx_size == 0, "not -c nv"
    assert args.system_prompt == "be brief"
    assert args.seed is None, "not -s ys"


def test_generate_renders_the_models_template(
    chat_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tok = Tokenizer.load(chat_model)
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hello world"}]
    want = len(tok.apply_chat_template(msgs))
    raw = len(tok.encode("hello world"))
    for flags, n in (
        ([], want),  # a model with a template: a chat, as llama.cpp and mlx-lm do
        (["-cnv"], want),
        (["--no-chat-template"], raw),
        (["-no-cnv"], raw),
    ):
        sys_flags = [] if n == raw else ["-sys", "S"]
        code = main(
            ["generate", str(chat_model), "-p", "hello world", "-n", "2", *flags, *sys_flags]
        )
        assert code == 0
        assert _prompt_tokens(capsys.readouterr().err) == n, flags


def test_generate_with_a_template_file_and_without_a_template(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, tok = load_default()
    f = tmp_path / "t.jinja"
    f.write_text("Q: {{ messages[-1].content }}\nA:")
    assert main(["generate", "-p", "Emma", "-n", "2", "--chat-template", str(f)]) == 0
    assert _prompt_tokens(capsys.readouterr().err) == len(tok.encode("Q: Emma\nA:"))
    # The bundled model has no template: -cnv asks for one it cannot have.
    assert main(["generate", "-p", "Emma", "-n", "2", "-cnv"]) == 2
    assert "--chat-template" in capsys.readouterr().err
    assert main(["generate", "-p", "Emma", "-n", "2", "-cnv", "--no-chat-template"]) == 2
    capsys.readouterr()


def test_pre_tokenizer_flag_overrides_an_unknown_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fields = chatml_fields() | {"tokenizer.ggml.pre": "mystery"}
    n = len(fields["tokenizer.ggml.tokens"])
    path = write_gguf(make_tiny(vocab=n), tmp_path / "m.gguf", tokenizer=fields)
    assert main(["generate", str(path), "-p", "hi", "-n", "1"]) == 2
    assert "--pre-tokenizer" in capsys.readouterr().err
    assert main(["generate", str(path), "-p", "hi", "-n", "1", "--pre-tokenizer", "gpt-2"]) == 0
