"""The rlx-lm command: streams what the library generates; errors are one line and exit 2."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import gguf
import pytest
from model_factory import make_tiny, write_gguf
from tokenizer_factory import spm_gguf_fields, spm_vocab

from rlx_lm.cli import _Progress, main
from rlx_lm.generation import generate
from rlx_lm.runners.llama import load_llama
from rlx_lm.tokenizer import Tokenizer

TOKENS, _, _ = spm_vocab()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "m.gguf"
    return write_gguf(
        make_tiny("llama", seed=8, vocab=len(TOKENS)), path, tokenizer=spm_gguf_fields()
    )


def test_generate_streams_what_the_library_generates(
    model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", str(model), "-p", "hello world", "-n", "6"]) == 0
    out, err = capsys.readouterr()
    want = generate(
        load_llama(model, max_seq=64), Tokenizer.load(model), "hello world", max_tokens=6
    )
    assert out == want.text + "\n"
    assert "prefill:" in err
    assert "decode:" in err
    assert "tok/s" in err
    assert "\r" not in err, "no progress bar when stderr is not a terminal"


def test_sampler_flags_reach_the_chain(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["generate", str(model), "-p", "the cat", "-n", "12", "--temp", "1.5", "--top-k", "50"]
    outs = []
    for seed in ("1", "1", "2"):
        assert main([*args, "--seed", seed]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]
    assert outs[0] != outs[2]
    assert main([*args, "--top-p", "1.5"]) == 2, "an invalid knob is a clean error"
    assert "top_p" in capsys.readouterr().err


def test_bad_inputs_give_one_line_and_exit_2(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = write_gguf(
        make_tiny(vocab=len(TOKENS)),
        tmp_path / "x.gguf",
        tokenizer=spm_gguf_fields(),
        arch_override="gpt2",
    )
    for path in (tmp_path / "missing.gguf", other):
        assert main(["generate", str(path), "-p", "hi"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("rlx-lm: error: ")
        assert err.count("\n") == 1
    assert "gpt2" in err


def test_a_bad_path_has_no_traceback_from_the_installed_command(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rlx_lm.cli", "generate", str(tmp_path / "nope.gguf"), "-p", "x"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "nope.gguf" in proc.stderr


def test_unsupported_quant_type_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = make_tiny("llama", seed=5, vocab=len(TOKENS))
    q5 = gguf.GGMLQuantizationType.Q5_0
    path = write_gguf(m, tmp_path / "q.gguf", qtype="Q5_0", tokenizer=spm_gguf_fields())
    assert main(["generate", str(path), "-p", "hi", "-n", "1"]) == 2
    assert q5.name in capsys.readouterr().err


def test_progress_bar_draws_only_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        bar = _Progress(stream)
        bar.update("prefill", 5, 10)
        bar.clear()
    assert "5/10" in tty.getvalue()
    assert "#" * 15 in tty.getvalue()
    assert pipe.getvalue() == ""


def test_inspect_prints_the_report(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(model)]) == 0
    out = capsys.readouterr().out.lower()
    assert "gguf" in out
    assert "llama" in out


def test_stop_strings_and_context_size_flags(
    model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", str(model), "-p", "hello", "-n", "8"]) == 0
    full = capsys.readouterr().out.rstrip("\n")
    assert len(full) > 2
    stop = full[1:3]
    assert main(["generate", str(model), "-p", "hello", "-n", "8", "--stop", stop]) == 0
    out, err = capsys.readouterr()
    assert out.rstrip("\n") == full[: full.find(stop)]
    assert "stop: stop" in err
    assert main(["generate", str(model), "-p", "hello", "-n", "8", "-c", "4"]) == 2
    assert "max_seq=4" in capsys.readouterr().err
    assert main(["generate", str(model), "-p", "hello", "-n", "-1"]) == 2


def test_packed_and_unpacked_generate_the_same_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    m = make_tiny("llama", seed=8, vocab=len(TOKENS))
    path = write_gguf(m, tmp_path / "q8.gguf", qtype="Q8_0", tokenizer=spm_gguf_fields())
    outs = []
    for flag in ("--packed", "--no-packed"):
        assert main(["generate", str(path), "-p", "the cat", "-n", "6", flag]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]
