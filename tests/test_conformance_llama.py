"""The reference Llama runner keeps the contract the kit checks (tiny random weights)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from model_factory import make_tiny, write_gguf, write_safetensors_dir

from rlx_lm.runners.llama import LlamaRunner, load_llama
from rlx_lm.testing import check_runner


@pytest.fixture(scope="module")
def llama_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[[], LlamaRunner]:
    directory = write_safetensors_dir(make_tiny(), tmp_path_factory.mktemp("tiny-llama"))
    base = load_llama(directory, max_seq=32)
    # Weights load once; each runner the kit asks for gets its own session cache.
    return lambda: base.clone(max_seq=32)


def test_the_llama_runner_passes_every_clause_it_claims(
    llama_factory: Callable[[], LlamaRunner],
) -> None:
    report = check_runner(llama_factory, max_examples=10, name="LlamaRunner")
    report.raise_for_failures()
    assert [r.clause for r in report.skips] == ["multimodal.phases"]
    # Its own cached pair and sessions were exercised, not rlx_lm's defaults.
    assert "HostDriven" not in report["host_driven.decode"].message
    assert report["sessions.reuse"].passed


def test_a_gemma3_runner_passes_the_same_clauses(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Gemma 3's windowed layers, local RoPE and post norms decode on the general path, not
    # the team's: the contract (batched == one by one, sessions, snapshots) must hold there.
    m = make_tiny("gemma3", seed=5, layers=4, tie=True)
    base = load_llama(write_gguf(m, tmp_path_factory.mktemp("g3") / "m.gguf"), max_seq=32)
    report = check_runner(lambda: base.clone(max_seq=32), max_examples=10, name="gemma3")
    report.raise_for_failures()
    assert report["sessions.reuse"].passed
