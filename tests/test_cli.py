"""The rlx-lm command: streams what the library generates; errors are one line and exit 2."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
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
    # Q8_1: no kernel, and gguf.quants cannot decode it either
    q81 = gguf.GGMLQuantizationType.Q8_1
    path = tmp_path / "q.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for key, val in spm_gguf_fields().items():
        if isinstance(val, list):
            w.add_array(key, val)
        elif isinstance(val, bool):
            w.add_bool(key, val)
        elif isinstance(val, int):
            w.add_uint32(key, val)
        else:
            w.add_string(key, val)
    for key, n in (("block_count", 1), ("embedding_length", 32), ("attention.head_count", 4)):
        w.add_uint32(f"llama.{key}", n)
    w.add_uint32("llama.feed_forward_length", 64)
    w.add_tensor("token_embd.weight", np.zeros((len(TOKENS), 40), np.uint8), raw_dtype=q81)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert main(["generate", str(path), "-p", "hi", "-n", "1"]) == 2


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
    # a context that fills up ends the generation, with the reason on the timing line
    assert main(["generate", str(model), "-p", "hello", "-n", "8", "-c", "4"]) == 0
    out, err = capsys.readouterr()
    assert "stop: context" in err
    assert 0 < len(out.rstrip("\n")) < len(full)
    # a prompt longer than the context cannot start
    assert main(["generate", str(model), "-p", "hello " * 8, "-n", "8", "-c", "4"]) == 2
    assert "no room left in a context of 4" in capsys.readouterr().err
    assert main(["generate", str(model), "-p", "hello", "-n", "-2"]) == 2


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


def test_cache_type_flags_set_the_kv_dtype(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlx_lm import LmRunnerBuilder

    m = make_tiny("llama", seed=8, vocab=len(TOKENS))
    path = write_gguf(m, tmp_path / "q8.gguf", qtype="Q8_0", tokenizer=spm_gguf_fields())
    built: list[str] = []
    real_build = LmRunnerBuilder.build

    def build(self: LmRunnerBuilder) -> object:
        built.append(self.kv_dtype())
        return real_build(self)

    monkeypatch.setattr(LmRunnerBuilder, "build", build)
    args = ["generate", str(path), "-p", "the cat", "-n", "4"]
    assert main([*args, "-ctk", "f16", "-ctv", "f16"]) == 0
    assert main([*args, "--cache-type-k", "f32"]) == 0
    assert main(args) == 0
    assert built == ["float16", "float32", "float32"]
    capsys.readouterr()
    assert main([*args, "-ctk", "f16", "-ctv", "f32"]) == 2
    assert "-ctk and -ctv must match" in capsys.readouterr().err


def test_a_directory_of_ggufs_uses_the_picked_file_and_its_tokenizer(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "ggufs"
    d.mkdir()
    (d / "m-Q4_K_M.gguf").write_bytes(model.read_bytes())
    assert main(["generate", str(d), "-p", "hello world", "-n", "5"]) == 0
    from_dir = capsys.readouterr().out
    assert main(["generate", str(model), "-p", "hello world", "-n", "5"]) == 0
    assert from_dir == capsys.readouterr().out


def test_threads_and_the_default_context(
    model: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlx_lm import LmRunnerBuilder

    built: list[LmRunnerBuilder] = []
    real = LmRunnerBuilder.build

    def spy(self: LmRunnerBuilder) -> object:
        built.append(self)
        return real(self)

    monkeypatch.setattr(LmRunnerBuilder, "build", spy)
    assert main(["generate", str(model), "-p", "hello", "-n", "2", "-t", "1"]) == 0
    capsys.readouterr()
    assert built[-1].threads() == 1
    # no -c: the model's trained context (the factory writes 512)
    assert built[-1].max_seq() == 512
    assert main(["generate", str(model), "-p", "hello", "-n", "2", "-t", "0"]) == 2
    assert "-t must be >= 1" in capsys.readouterr().err


def test_every_llama_cpp_flag_sets_its_sample_opts_field() -> None:
    from rlx_lm import MirostatMode
    from rlx_lm.cli import _parser, _sample_opts

    values = {
        "--temp": ("temperature", "0.7", 0.7),
        "--top-k": ("top_k", "40", 40),
        "--top-p": ("top_p", "0.9", 0.9),
        "--min-p": ("min_p", "0.05", 0.05),
        "--typical": ("typical_p", "0.8", 0.8),
        "--repeat-penalty": ("repetition_penalty", "1.1", 1.1),
        "--repeat-last-n": ("repetition_window", "32", 32),
        "--presence-penalty": ("presence_penalty", "0.5", 0.5),
        "--frequency-penalty": ("frequency_penalty", "0.25", 0.25),
        "--dry-multiplier": ("dry_multiplier", "0.8", 0.8),
        "--dry-base": ("dry_base", "1.5", 1.5),
        "--dry-allowed-length": ("dry_allowed_length", "3", 3),
        "--xtc-probability": ("xtc_prob", "0.5", 0.5),
        "--xtc-threshold": ("xtc_threshold", "0.1", 0.1),
        "--top-nsigma": ("top_n_sigma", "1.5", 1.5),
        "--mirostat": ("mirostat", "2", MirostatMode.V2),
        "--mirostat-lr": ("mirostat_eta", "0.2", 0.2),
        "--mirostat-ent": ("mirostat_tau", "4.0", 4.0),
        "--seed": ("seed", "7", 7),
    }
    argv = ["generate", "m.gguf", "-p", "x"]
    for flag, (_, text, _) in values.items():
        argv += [flag, text]
    opts = _sample_opts(_parser().parse_args(argv))
    for flag, (field, _, want) in values.items():
        assert getattr(opts, field) == pytest.approx(want), flag
