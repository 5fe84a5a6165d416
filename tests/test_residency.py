"""How the weight files are held (``use_mmap``): mapped, or copied into the process's memory in
huge pages; the logits are the same bits either way, the automatic choice follows the
machine, and the setting reaches the engine from the builder and the CLI."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
from model_factory import make_tiny, quantize_model, write_gguf

from rlx_lm import LmRunnerBuilder
from rlx_lm.errors import InvalidOptionError
from rlx_lm.runners.llama import load_llama

IDS = [1, 5, 7, 3, 9, 100, 2, 50]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    m, raw = quantize_model(make_tiny("llama", seed=5), "Q8_0")
    return write_gguf(m, tmp_path_factory.mktemp("res") / "m.gguf", qtype="Q8_0", raw=raw)


def _auto_copies(size: int) -> bool:
    """What the automatic choice should be here: huge pages on, small file, room to spare."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
        mode = text[text.index("[") + 1 : text.index("]")]
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        avail = next(int(line.split()[1]) * 1024 for line in meminfo if "MemAvailable" in line)
    except (OSError, ValueError, StopIteration):
        return False
    return mode in ("always", "madvise") and size <= min(avail // 2, 1 << 30)


def test_mapped_and_copied_weights_give_the_same_logits(tiny: Path) -> None:
    logits = {}
    for use_mmap, held in ((True, "mapped"), (False, "copied")):
        runner = load_llama(tiny, max_seq=16, use_mmap=use_mmap)
        assert runner.residency == held
        out = [runner.prefill_logits(IDS[:4])]
        out += [runner.decode_logits(t) for t in IDS[4:]]
        logits[held] = np.stack(out)
    np.testing.assert_array_equal(logits["mapped"], logits["copied"])


def test_the_automatic_choice_follows_the_machine(tiny: Path) -> None:
    runner = load_llama(tiny, max_seq=16)
    expected = "copied" if _auto_copies(tiny.stat().st_size) else "mapped"
    assert runner.residency == expected


def test_a_copied_model_does_not_read_its_file_again(tiny: Path, tmp_path: Path) -> None:
    """Copied weights are the process's own: the file may change on disk afterwards (a
    mapped model would see the new bytes)."""
    path = tmp_path / "copy.gguf"
    path.write_bytes(tiny.read_bytes())
    copied = load_llama(path, max_seq=16, use_mmap=False)
    mapped = load_llama(path, max_seq=16, use_mmap=True)
    before = copied.prefill_logits(IDS)
    np.testing.assert_array_equal(mapped.prefill_logits(IDS), before)
    data = bytearray(path.read_bytes())
    data[-4096:] = bytes(4096)  # zero the tail of the tensor data in place
    with path.open("r+b") as f:
        f.write(data)
    np.testing.assert_array_equal(copied.prefill_logits(IDS), before)
    assert not np.array_equal(mapped.prefill_logits(IDS), before)  # the write reached weights


def test_use_mmap_is_checked_and_reaches_the_engine_from_the_builder(tiny: Path) -> None:
    with pytest.raises(InvalidOptionError, match="use_mmap"):
        load_llama(tiny, use_mmap="no")  # type: ignore[arg-type]
    b = LmRunnerBuilder(weights=tiny, max_seq=16)
    assert b.use_mmap() is None
    with pytest.raises(InvalidOptionError, match="use_mmap"):
        b.use_mmap(0)  # type: ignore[arg-type]
    assert b.use_mmap(False).build().residency == "copied"  # type: ignore[attr-defined]
    assert LmRunnerBuilder(weights=tiny, max_seq=16, use_mmap=True).build().residency == (  # type: ignore[attr-defined]
        "mapped"
    )


def test_the_cli_flags_set_use_mmap() -> None:
    from rlx_lm.cli import _engine_settings, _parser

    parser: argparse.ArgumentParser = _parser()
    for cmd in (["generate", "m.gguf", "-p", "x"], ["chat", "m.gguf"], ["serve", "m.gguf"]):
        assert _engine_settings(parser.parse_args([*cmd, "--no-mmap"]))["use_mmap"] is False
        assert _engine_settings(parser.parse_args([*cmd, "--mmap"]))["use_mmap"] is True
        assert "use_mmap" not in _engine_settings(parser.parse_args(cmd))
