"""Multi-turn chat: ChatSession keeps the KV cache between turns; ``rlx-lm chat`` for real.

The REPL is driven as a user would: lines piped into the installed command, and a
pseudo-terminal (readline prompt, Ctrl-D), on the bundled model.
"""

from __future__ import annotations

import io
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
from rlx_lm.chat import ChatSession, run_repl
from rlx_lm.cli import _parser, main
from rlx_lm.errors import CapacityError
from rlx_lm.generation import generate, load_model
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


class Counting:
    """A runner that forwards to ``inner`` and counts the positions it computes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.family = inner.family
        self.vocab_size = inner.vocab_size
        self.max_seq = inner.max_seq
        self.computed = 0
        self.session: tuple[int, ...] = ()

    def predict_logits(self, ids: Any) -> Any:
        self.computed += len(ids)
        return self.inner.predict_logits(ids)

    def prefill_logits(self, ids: Any) -> Any:
        self.computed += len(ids)
        return self.inner.prefill_logits(ids)

    def prefill_logits_reusing(self, ids: Any, snapshot: Any, reuse: int) -> Any:
        self.computed += len(ids) - min(reuse, len(ids) - 1)
        return self.inner.prefill_logits_reusing(ids, snapshot, reuse)

    def decode_logits(self, token: int) -> Any:
        self.computed += 1
        return self.inner.decode_logits(token)

    def export_session(self) -> Any:
        snap = self.inner.export_session()
        self.session = tuple(snap.tokens)
        return snap

    def restore_session(self, snapshot: Any) -> bool:
        return bool(self.inner.restore_session(snapshot))


def _turn_is_counted(chat: ChatSession, runner: Counting, user: str) -> tuple[list[int], Any]:
    """Send ``user``; its prefill computes only what follows the tokens already cached."""
    cached = runner.session
    ids = chat.prompt_ids(user)
    before = runner.computed
    res = chat.send(user)
    assert len(cached) > 0
    assert tuple(ids[: len(cached)]) == cached, "the new prompt extends the cached tokens"
    decoded = len(res.tokens) - (res.stop_reason != "eos")  # the last sampled one is not fed
    assert runner.computed - before == len(ids) - len(cached) + decoded
    assert res.reused_tokens == len(cached)
    return ids, res


@pytest.mark.parametrize("model", ["bundled", "chatml"])
def test_only_the_new_turn_is_prefilled(model: str, chat_model: Path) -> None:
    if model == "bundled":
        inner, tok = load_default()
    else:
        inner, tok = load_model(chat_model, max_seq=256)
    runner = Counting(inner)
    chat = ChatSession(runner, tok, system_prompt="A novel.", max_tokens=5)
    first = chat.send("Elizabeth said")
    assert (first.reused_tokens, runner.computed) == (
        0,
        first.prompt_tokens + len(first.tokens) - (first.stop_reason != "eos"),
    )
    assert chat.chat_template is not None
    for user in ("and then", "Mr. Darcy replied", "hello world"):
        past = chat.chat_template.render(chat.messages, special_tokens=tok.special_tokens)
        now = chat.chat_template.render(
            [*chat.messages, {"role": "user", "content": user}],
            add_generation_prompt=True,
            special_tokens=tok.special_tokens,
        )
        assert now.startswith(past)
        ids, res = _turn_is_counted(chat, runner, user)
        # what is computed: the end of the last reply's turn, then the new user turn
        eot = chat.chat_template.end_of_turn_text(tok.special_tokens)
        new = tok.encode(eot + now[len(past) :], add_special_tokens=False)
        assert len(ids) - res.reused_tokens <= len(new) + 1
    if model == "bundled":
        # reusing the cache changed nothing: a fresh prefill of the same prompt agrees
        assert generate(inner, tok, ids, max_tokens=5).tokens == res.tokens


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

    def read_until_prompts(n: int, limit: float = 120) -> None:
        """Read the terminal until it has shown ``n`` prompts (or the child ends, or a bound)."""
        nonlocal seen
        end = time.monotonic() + limit
        while seen.count(b"> ") < n and time.monotonic() < end:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(leader, 4096)
                except OSError:  # the child closed the terminal
                    return
                if not chunk:
                    return
                seen += chunk
            elif proc.poll() is not None:
                return

    try:
        read_until_prompts(1)
        assert seen.count(b"> ") == 1, seen
        os.write(leader, b"Elizabeth said\r")
        read_until_prompts(2)
        assert seen.count(b"> ") == 2, seen
        echoed, reply = seen.split(b"> ")[1].split(b"\r\n", 1)
        assert echoed == b"Elizabeth said", "the terminal echoed the line"
        assert reply.strip(), "a reply was written before the next prompt"
        os.write(leader, b"\x04")  # Ctrl-D at the prompt
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    assert b"Traceback" not in seen


class _Scripted:
    """A stand-in session for `run_repl`: records what it is sent and what it must do."""

    def __init__(self, interrupt_on: str = "") -> None:
        self.sent: list[str] = []
        self.cleared = 0
        self.interrupt_on = interrupt_on

    def clear(self) -> None:
        self.cleared += 1

    def send(self, text: str, *, on_text: Any = None, on_reasoning: Any = None) -> Any:
        self.sent.append(text)
        on_reasoning("(thinking)")
        on_text(f"<{text}>")
        if text == self.interrupt_on:
            raise KeyboardInterrupt
        return None


def test_repl_commands_and_a_cut_reply() -> None:
    session = _Scripted(interrupt_on="long")
    out, err = io.StringIO(), io.StringIO()
    lines = "hi\n\n   \n/help\nlong\n/clear\nagain\n/exit\nnever\n"
    code = run_repl(session, stdin=io.StringIO(lines), out=out, err=err)  # type: ignore[arg-type]
    assert code == 0
    assert session.sent == ["hi", "long", "again"], "blank lines are skipped, /exit ends"
    assert session.cleared == 1
    # Ctrl-C in a reply ends that reply on its own line and the chat goes on
    assert out.getvalue() == "<hi>\n<long>\n<again>\n"
    assert "/clear" in err.getvalue()
    assert "conversation cleared" in err.getvalue()


def test_repl_ends_at_end_of_input_and_at_ctrl_c_on_the_prompt() -> None:
    session = _Scripted()
    out = io.StringIO()
    assert run_repl(session, stdin=io.StringIO("one"), out=out, err=io.StringIO()) == 0  # type: ignore[arg-type]
    assert session.sent == ["one"]

    class Interrupting(io.StringIO):
        def readline(self, size: int | None = -1) -> str:
            raise KeyboardInterrupt

    code = run_repl(session, stdin=Interrupting(), out=io.StringIO(), err=io.StringIO())  # type: ignore[arg-type]
    assert code == 130


def test_the_repl_shows_reasoning_dimmed_on_a_terminal_only() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    run_repl(_Scripted(), stdin=io.StringIO("q\n"), out=out, err=io.StringIO())  # type: ignore[arg-type]
    assert out.getvalue() == "\x1b[2m(thinking)\x1b[0m<q>\n"
    piped = io.StringIO()
    run_repl(_Scripted(), stdin=io.StringIO("q\n"), out=piped, err=io.StringIO())  # type: ignore[arg-type]
    assert piped.getvalue() == "<q>\n", "the answer alone when the output is not a terminal"


def test_a_reply_cut_by_ctrl_c_is_kept_and_the_chat_goes_on(
    bundled: tuple[Any, Tokenizer],
) -> None:
    runner, tok = bundled
    chat = ChatSession(runner, tok, max_tokens=8)
    shown: list[str] = []

    def stop_after_two(piece: str) -> None:
        shown.append(piece)
        if len(shown) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        chat.send("Elizabeth said", on_text=stop_after_two)
    assert chat.messages == [
        {"role": "user", "content": "Elizabeth said"},
        {"role": "assistant", "content": "".join(shown)},
    ]
    nxt = chat.send("and then")
    assert nxt.tokens
    assert chat.messages[-2] == {"role": "user", "content": "and then"}
    want = tok.apply_chat_template(chat.messages[:-1], chat_template=chat.chat_template)
    assert generate(runner, tok, want, max_tokens=8).tokens == nxt.tokens


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


def test_a_session_samples_in_the_order_it_is_given(bundled: tuple[Any, Tokenizer]) -> None:
    from rlx_lm import InvalidOptionError, SampleOpts

    runner, tok = bundled
    opts = SampleOpts(temperature=1.5, top_k=20, top_p=0.9, min_p=0.02, seed=11)
    for order in ("hf", "llama.cpp"):
        chat = ChatSession(runner, tok, opts=opts, order=order, max_tokens=6)
        ids = chat.prompt_ids("Elizabeth said")
        got = chat.send("Elizabeth said")
        want = generate(runner, tok, ids, opts=opts, order=order, max_tokens=6)
        assert got.tokens == want.tokens, order
    with pytest.raises(InvalidOptionError):
        ChatSession(runner, tok, opts=opts, order=["no_such_stage"], max_tokens=2).send("x")


def test_chat_command_passes_its_sampler_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # --sampler-order and --samplers are chat flags too: they reach the session.
    import rlx_lm.chat as chat_module

    seen: list[object] = []
    real = chat_module.ChatSession

    def spy(*args: Any, **kw: Any) -> ChatSession:
        seen.append(kw["order"])
        return real(*args, **kw)

    monkeypatch.setattr(chat_module, "ChatSession", spy)
    monkeypatch.setattr(chat_module, "run_repl", lambda *a, **kw: 0)
    assert main(["chat", "-n", "2", "--sampler-order", "hf"]) == 0
    assert main(["chat", "-n", "2", "--samplers", "top_k;temperature"]) == 0
    assert main(["chat", "-n", "2"]) == 0
    assert seen == ["hf", ["logit_bias", "top_k", "temperature"], "llama.cpp"]


def test_chat_command_takes_the_engine_flags_generate_and_serve_take(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # --activations and -ctk/-ctv reach the runner chat builds (they were not chat flags).
    import rlx_lm.chat as chat_module
    from rlx_lm import LmRunnerBuilder

    built: list[tuple[str, str]] = []
    real_build = LmRunnerBuilder.build

    def build(self: LmRunnerBuilder) -> object:
        built.append((self.kv_dtype(), self.activations()))
        return real_build(self)

    monkeypatch.setattr(LmRunnerBuilder, "build", build)
    monkeypatch.setattr(chat_module, "run_repl", lambda *a, **kw: 0)
    flags = ["--activations", "q8", "-ctk", "f16", "-ctv", "f16"]
    assert main(["chat", "-n", "2", "-c", "64", *flags]) == 0
    assert main(["chat", "-n", "2", "-c", "64"]) == 0
    assert built == [("float16", "q8"), ("float32", "exact")]


GEMMA = Path(__file__).parent / "data" / "chat_templates" / "gemma.jinja"


def test_a_system_prompt_is_folded_into_a_template_that_refuses_one(chat_model: Path) -> None:
    from rlx_lm.chat import render_conversation
    from rlx_lm.chat_template import ChatTemplate
    from rlx_lm.errors import ChatTemplateError

    tok = Tokenizer.load(chat_model)
    gemma = ChatTemplate.from_file(GEMMA)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        gemma.render(msgs)
    # as llama.cpp does: the system message goes first in the first user turn
    text = render_conversation(tok, msgs, chat_template=gemma, tokenize=False)
    bos = tok.special_tokens["bos_token"]
    assert text == f"{bos}<start_of_turn>user\nBe brief.\nHi<end_of_turn>\n<start_of_turn>model\n"
    # a refusal that folding does not cure is the template's own error
    alternate = [msgs[0], msgs[1], msgs[1]]
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        render_conversation(tok, alternate, chat_template=gemma)
    # a multi-turn chat with a system prompt on such a template
    runner, _ = load_model(chat_model, max_seq=256)
    chat = ChatSession(runner, tok, system_prompt="Be brief.", max_tokens=3, chat_template=gemma)
    chat.send("Hi")
    again = chat.send("More")
    assert again.reused_tokens > 0
    assert main(["generate", str(chat_model), "-p", "Hi", "-n", "1", "--chat-template",
                 str(GEMMA), "-sys", "Be brief."]) == 0  # fmt: skip
