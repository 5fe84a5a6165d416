"""llama.cpp's command-line habits: -m, -s, -f, stdin prompts, -n -1, -e, --verbose, --version,
--help with defaults, the seed of an unseeded run, `| head`, and errors naming the real cause."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from model_factory import make_tiny, write_gguf
from tokenizer_factory import spm_gguf_fields, spm_vocab

from rlx_lm import __version__
from rlx_lm.cli import _parser, main, process_escapes

TOKENS, _, _ = spm_vocab()
SAMPLE = ["--temp", "1.5", "--top-k", "50"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli_flags") / "m.gguf"
    return write_gguf(
        make_tiny("llama", seed=3, vocab=len(TOKENS)), path, tokenizer=spm_gguf_fields()
    )


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def decoded(err: str) -> int:
    m = re.search(r"decode: (\d+) tokens", err)
    assert m is not None, err
    return int(m.group(1))


def test_model_as_a_flag_or_positionally(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, positional, _ = run(capsys, "generate", str(model), "-p", "hello", "-n", "5")
    _, flag, _ = run(capsys, "generate", "-m", str(model), "-p", "hello", "-n", "5")
    _, long, _ = run(capsys, "generate", "--model", str(model), "-p", "hello", "-n", "5")
    _, both, _ = run(capsys, "generate", str(model), "-m", str(model), "-p", "hello", "-n", "5")
    assert positional == flag == long == both
    code, _, err = run(capsys, "generate", str(model), "-m", "other.gguf", "-p", "x")
    assert code == 2
    assert "two models" in err
    assert run(capsys, "inspect", "-m", str(model))[0] == 0
    code, _, err = run(capsys, "inspect")
    assert code == 2
    assert "inspect needs a model" in err


def test_short_seed_flag_and_an_unseeded_run_reports_its_seed(
    model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["generate", str(model), "-p", "the cat", "-n", "12", *SAMPLE]
    _, short, _ = run(capsys, *base, "-s", "11")
    _, long, err = run(capsys, *base, "--seed", "11")
    assert short == long
    assert "seed" not in err, "a seeded run has no seed to report"
    code, first, err = run(capsys, *base)
    assert code == 0
    m = re.search(r"seed (\d+) \(pass -s \1 to repeat this run\)", err)
    assert m is not None, err
    _, again, _ = run(capsys, *base, "-s", m.group(1))
    assert again == first, "the reported seed reproduces the unseeded run"
    code, _, err = run(capsys, *base, "-s", "-1")
    assert code == 0
    assert re.search(r"seed \d+", err), "-s -1 is llama.cpp's random seed"
    code, _, err = run(capsys, "generate", str(model), "-p", "the cat", "-n", "3")
    assert code == 0
    assert "seed" not in err, "greedy decoding draws nothing and reports no seed"


def test_prompt_from_a_file(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "prompt.txt"
    f.write_text("hello world", encoding="utf-8")
    _, from_p, _ = run(capsys, "generate", str(model), "-p", "hello world", "-n", "6")
    _, from_f, _ = run(capsys, "generate", str(model), "-f", str(f), "-n", "6")
    assert from_f == from_p
    code, _, err = run(capsys, "generate", str(model), "-f", str(f), "-p", "x")
    assert (code, "not both" in err) == (2, True)
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9")
    code, _, err = run(capsys, "generate", str(model), "-f", str(bad))
    assert code == 2
    assert "not UTF-8" in err
    code, _, err = run(capsys, "generate", str(model), "-f", str(tmp_path / "missing.txt"))
    assert code == 2
    assert "missing.txt" in err


def test_prompt_from_standard_input(
    model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, from_p, _ = run(capsys, "generate", str(model), "-p", "hello world", "-n", "6")
    for extra in ([], ["-p", "-"]):
        monkeypatch.setattr(sys, "stdin", io.StringIO("hello world"))
        code, out, _ = run(capsys, "generate", str(model), "-n", "6", *extra)
        assert (code, out) == (0, from_p), extra
    monkeypatch.setattr(sys, "stdin", None)
    code, _, err = run(capsys, "generate", str(model), "-n", "6")
    assert code == 2
    assert "no prompt" in err


def test_prompt_from_a_pipe_in_the_installed_command(model: Path) -> None:
    cmd = [sys.executable, "-m", "rlx_lm.cli", "generate", str(model), "-n", "4", "-s", "1"]
    piped = subprocess.run(cmd, input="hello", capture_output=True, text=True, check=True)
    flagged = subprocess.run([*cmd, "-p", "hello"], capture_output=True, text=True, check=True)
    assert piped.stdout == flagged.stdout
    assert piped.stdout.strip()


def test_n_minus_one_generates_until_the_context_is_full(
    model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlx_lm.tokenizer import Tokenizer

    n_prompt = len(Tokenizer.load(model).encode("hello"))
    code, _, err = run(capsys, "generate", str(model), "-p", "hello", "-n", "-1", "-c", "20")
    assert code == 0
    assert "stop: length" in err or "stop: eos" in err
    if "stop: length" in err:
        assert decoded(err) == 20 - n_prompt
    else:
        assert decoded(err) <= 20 - n_prompt
    # without -c, -1 fills the context the model was trained with (the header's context_length)
    code, _, err = run(capsys, "generate", str(model), "-p", "hello", "-n", "-1", "--verbose")
    assert code == 0
    m = re.search(r"context (\d+), up to (\d+) new tokens", err)
    assert m is not None, err
    assert int(m.group(2)) == int(m.group(1)) - n_prompt
    assert decoded(err) <= int(m.group(2))
    code, _, err = run(capsys, "generate", str(model), "-p", "hello", "-n", "-2")
    assert code == 2
    assert "-1" in err
    code, _, err = run(capsys, "generate", str(model), "-p", "hello " * 30, "-n", "-1", "-c", "8")
    assert code == 2
    assert "no room" in err


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        (r"a\nb", "a\nb"),
        (r"tab\there", "tab\there"),
        (r"cr\r", "cr\r"),
        (r"\"quoted\" \'single\'", "\"quoted\" 'single'"),
        (r"back\\slash", "back\\slash"),
        (r"\x41\x7a", "Az"),
        (r"\q unknown", r"\q unknown"),
        (r"\x4 short", r"\x4 short"),
        (r"\xZZ", r"\xZZ"),
        ("trailing\\", "trailing\\"),
        (r"\\n", "\\n"),
        ("plain", "plain"),
    ],
)
def test_escapes_follow_llama_cpp(typed: str, meant: str) -> None:
    assert process_escapes(typed) == meant


def test_escape_flag_is_on_by_default(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, real_newline, _ = run(capsys, "generate", str(model), "-p", "hi\nthere", "-n", "6")
    _, escaped, _ = run(capsys, "generate", str(model), "-p", r"hi\nthere", "-n", "6")
    _, short, _ = run(capsys, "generate", str(model), "-p", r"hi\nthere", "-n", "6", "-e")
    assert escaped == real_newline == short
    code, _, err = run(
        capsys, "generate", str(model), "-p", r"hi\nthere", "-n", "6", "--no-escape", "--verbose"
    )
    assert code == 0
    _, _, err_escaped = run(capsys, "generate", str(model), "-p", r"hi\nthere", "-n", "6", "-v")
    assert re.search(r"prompt (\d+) tokens", err) != re.search(r"prompt (\d+) tokens", err_escaped)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"rlx-lm {__version__}"


def test_verbose_reports_the_run(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "generate", str(model), "-p", "hi", "-n", "3", "-s", "5")
    assert code == 0
    assert str(model) not in err
    code, out2, err = run(capsys, "generate", str(model), "-p", "hi", "-n", "3", "-s", "5", "-v")
    assert out2 == out, "--verbose changes what is reported, not what is generated"
    assert str(model) in err
    assert "context" in err
    assert "seed=5" in err


def _help_of(parser_args: list[str]) -> dict[str, str]:
    """Option -> its help text as argparse prints it (with the default filled in)."""
    parser = _parser()
    sub = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    p = sub[parser_args[0]] if parser_args else parser
    fmt = p._get_formatter()
    out = {}
    for action in p._actions:
        if action.option_strings and action.help is not None:
            out[action.option_strings[-1]] = fmt._expand_help(action)  # type: ignore[attr-defined]
    return out


def test_help_has_one_sentence_per_flag_and_shows_defaults() -> None:
    from rlx_lm.cli import _SAMPLER_FLAGS
    from rlx_lm.sample_opts import SampleOpts

    helps = _help_of(["generate"])
    defaults = SampleOpts()
    for flag, (field, _) in _SAMPLER_FLAGS.items():
        text = helps[flag]
        assert "SampleOpts." not in text, flag
        assert text[0].isupper(), (flag, text)
        value = getattr(defaults, field)
        value = getattr(value, "value", value)
        shown = "unset" if value is None else str(value)
        assert text.endswith(f"(default: {shown})"), (flag, text)
    assert helps["--n-predict"].endswith("(default: 128)")
    assert helps["--ctx-size"].endswith("(default: 0)")
    assert "on by default" in helps["--no-escape"]
    for flag, text in helps.items():
        if flag in ("--help",):
            continue
        sentence = re.sub(r"\s*\(default: [^)]*\)$", "", text)
        assert sentence.endswith((".", ")")), (flag, text)


def test_help_prints(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--temp" in out
    assert "(default: 0.0)" in out


def test_a_closed_pipe_ends_the_run_quietly(model: Path) -> None:
    # `rlx-lm generate ... | head -c 1`: the reader closes the pipe after one byte
    cmd = [sys.executable, "-m", "rlx_lm.cli", "generate", str(model), "-p", "hi", "-n", "400"]
    proc = subprocess.Popen(
        [*cmd, "-c", "420", "--temp", "1", "-s", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    assert proc.stdout.read(1)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err
    assert "error" not in err.lower()


def test_a_damaged_gguf_is_reported_as_damaged(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = model.read_bytes()
    cases = {
        "truncated.gguf": data[:64],
        "garbage.gguf": b"\x00\x01garbage" * 10,
        "empty.gguf": b"",
    }
    for name, content in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        code, _, err = run(capsys, "generate", str(path), "-p", "hi", "-n", "1")
        assert code == 2, name
        assert "tokenizer.json" not in err, (name, err)
        assert name in err, (name, err)
        assert err.count("\n") == 1, err


def test_serve_takes_the_model_as_a_flag_too() -> None:
    from rlx_lm.cli import _resolve_model

    for argv in (
        ["serve", "-m", "x.gguf"],
        ["serve", "x.gguf"],
        ["serve", "x.gguf", "-m", "x.gguf"],
    ):
        args = _parser().parse_args(argv)
        _resolve_model(args)
        assert args.model == "x.gguf", argv


def test_serve_flags_reach_the_server_config() -> None:
    pytest.importorskip("starlette")
    from rlx_lm.cli import _server_settings
    from rlx_lm.server import ServerConfig

    argv = ["serve", "x.gguf", "--prefill-chunk", "0", "--max-batch", "4"]
    argv += ["--prompt-cache-mb", "1", "--model-name", "n", "-c", "512"]
    cfg = ServerConfig(**_server_settings(_parser().parse_args(argv), "x"))
    assert (cfg.prefill_chunk, cfg.max_batch, cfg.max_n) == (0, 4, 4)
    assert (cfg.prompt_cache_bytes, cfg.model_name, cfg.max_context) == (1 << 20, "n", 512)
    # Without flags: the library's defaults, the file's stem as the name.
    cfg = ServerConfig(**_server_settings(_parser().parse_args(["serve", "x.gguf"]), "x"))
    assert cfg.prefill_chunk == ServerConfig().prefill_chunk
    assert cfg.model_name == "x"


def test_serve_api_key_from_the_flag_or_the_environment_and_never_in_help(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("starlette")
    from rlx_lm.cli import _server_settings
    from rlx_lm.server import ServerConfig

    def config(*flags: str) -> ServerConfig:
        return ServerConfig(**_server_settings(_parser().parse_args(["serve", "x", *flags]), "x"))

    monkeypatch.delenv("RLX_LM_API_KEY", raising=False)
    assert config().api_key is None
    # --ray: the replicas build their app from the same settings, key included
    import rlx_lm.cli as cli

    seen: list[dict[str, object]] = []
    monkeypatch.setattr(cli, "_serve_on_ray", lambda a, m, server, *_: seen.append(server) or 0)
    assert cli.main(["serve", "x.gguf", "--ray", "--api-key", "sk-ray"]) == 0
    assert seen[0]["api_key"] == "sk-ray"
    assert config("--api-key", "sk-flag").api_key == "sk-flag"
    monkeypatch.setenv("RLX_LM_API_KEY", "sk-env")
    assert config().api_key == "sk-env"
    assert config("--api-key", "sk-flag").api_key == "sk-flag"  # the flag wins
    with pytest.raises(SystemExit):
        _parser().parse_args(["serve", "--help"])
    assert "sk-env" not in capsys.readouterr().out
    # llama-server's and vLLM's names for --model-name
    for flag in ("-a", "--alias", "--served-model-name", "--model-name"):
        assert config(flag, "named").model_name == "named"


def test_serve_engine_flags_reach_the_runner_and_every_ray_replica(
    model: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("starlette")
    import rlx_lm.cli as cli
    import rlx_lm.server as server
    from rlx_lm import LmRunnerBuilder

    built: list[tuple[str, str, int | None]] = []
    real_build = LmRunnerBuilder.build

    def build(self: LmRunnerBuilder) -> object:
        built.append((self.kv_dtype(), self.activations(), self.threads()))
        return real_build(self)

    served: list[object] = []
    monkeypatch.setattr(LmRunnerBuilder, "build", build)
    monkeypatch.setattr(server, "serve", lambda runner, *a, **k: served.append(runner))
    flags = ["-ctk", "f16", "-ctv", "f16", "--activations", "q8", "-t", "1"]
    assert main(["serve", str(model), "-c", "64", *flags]) == 0
    assert main(["serve", str(model), "-c", "64"]) == 0
    assert built == [("float16", "q8", 1), ("float32", "exact", LmRunnerBuilder().threads())]
    assert getattr(served[0], "kv_dtype", None) == "float16"
    # --ray: the same settings go to every replica's load_model (they were dropped).
    seen: list[dict[str, object]] = []
    monkeypatch.setattr(cli, "_serve_on_ray", lambda a, m, s, engine, *_: seen.append(engine) or 0)
    assert main(["serve", str(model), "--ray", "--no-packed", *flags]) == 0
    assert seen == [
        {"packed_weights": False, "threads": 1, "activations": "q8", "kv_dtype": "float16"}
    ]
    capsys.readouterr()
    code, _, err = run(capsys, "serve", str(model), "-ctk", "f16", "-ctv", "f32")
    assert code == 2
    assert "-ctk and -ctv must match" in err, err
    assert len(built) == 2  # refused before anything was built


def test_serve_refuses_a_bad_prefill_chunk_before_loading(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("starlette")
    # A file that could not be built either: the flag is refused first.
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 8)
    code, _, err = run(capsys, "serve", "--prefill-chunk", "-1", "-m", str(bad))
    assert code == 2
    assert "prefill_chunk" in err, err
    assert err.count("\n") == 1, err


TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_serve_chat_template_replaces_the_models_in_one_process_and_on_ray(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("starlette")
    import rlx_lm.cli as cli
    import rlx_lm.server as server

    path = tmp_path / "t.jinja"
    path.write_text(TEMPLATE, encoding="utf-8")
    tokenizers: list[Any] = []
    monkeypatch.setattr(server, "serve", lambda runner, tok, **k: tokenizers.append(tok))
    for flag in ("--chat-template", "--chat-template-file"):
        assert main(["serve", str(model), "-c", "64", flag, str(path)]) == 0
        tok = tokenizers.pop()
        assert tok.chat_template.source == TEMPLATE
        text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
        assert text == "<user>hi</user>\n<assistant>"
    templates: list[Any] = []
    monkeypatch.setattr(cli, "_serve_on_ray", lambda *a: templates.append(a[4]) or 0)
    assert main(["serve", str(model), "--ray", "--chat-template", str(path)]) == 0
    assert templates[0].source == TEMPLATE
    # A broken template is refused before a model is loaded.
    path.write_text("{% for m in messages %}", encoding="utf-8")
    code, _, err = run(capsys, "serve", str(model), "--chat-template", str(path))
    assert code == 2
    assert "syntax error" in err
    assert not tokenizers


def test_a_ray_replica_takes_the_chat_template() -> None:
    pytest.importorskip("starlette")
    from rlx_lm.ray.serve import _Replica

    replica = _Replica(None, {"max_context": 64}, {"max_seq": 64}, chat_template=TEMPLATE)
    assert replica.tokenizer.chat_template.source == TEMPLATE
