"""The Rust engine against the numpy reference forward (tests/numpy_llama) on tiny random
models of every architecture and weight type; chunking, batching and KV growth invariants."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llama_fixtures import all_logits, forward_from_gguf
from model_factory import TinyModel, make_tiny, quantize_model, write_gguf

from rlx_lm import KvCache
from rlx_lm.runners.llama import LlamaRunner, load_llama
from rlx_lm.runners.llama_config import LLAMA_ARCHITECTURES

# gpt-oss (GGUF only, pieces the numpy forward does not have) is checked against the float64
# reference on its own: tests/test_gpt_oss.py.
ARCHS = [a for a in LLAMA_ARCHITECTURES if a != "gpt-oss"]
IDS = [1, 5, 7, 3, 9, 100, 2, 50, 4, 4, 4, 17]
QTYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K"]


def _model(arch: str, qtype: str, tmp: Path) -> Path:
    wide = qtype.endswith("_K") or qtype == "TQ2_0"
    m = make_tiny(
        arch,
        seed=3,
        hidden=256 if wide else 64,
        inter=256 if wide else 128,
        expert_inter=256 if wide else 64,
        tie=arch == "qwen3",
    )
    if arch == "mistral":
        m.config["sliding_window"] = 4
    if wide and arch == "gemma2":
        # The random K-quant blocks give logits in the thousands, which a cap of 6 would
        # flatten to one value; a cap above them keeps it applied and the logits apart.
        m.config["final_logit_softcapping"] = 1e4
    if qtype == "BF16":
        qm, raw = m, {}
    elif qtype == "TQ2_0":
        qm, raw = _tq2(m)
    else:
        qm, raw = quantize_model(m, qtype)
    return write_gguf(qm, tmp / f"{arch}-{qtype}.gguf", qtype=qtype, raw=raw)


def _tq2(m: TinyModel) -> tuple[TinyModel, dict[str, np.ndarray]]:
    import gguf
    from gguf.quants import dequantize, quantize

    qt = gguf.GGMLQuantizationType.TQ2_0
    raw = {n: quantize(a, qt) for n, a in m.tensors.items() if a.ndim == 2}
    out = {
        n: np.asarray(dequantize(raw[n], qt), np.float32).reshape(a.shape) if n in raw else a
        for n, a in m.tensors.items()
    }
    return TinyModel(dict(m.config), out), raw


def _engine_all(runner: LlamaRunner, ids: list[int]) -> np.ndarray:
    cache = KvCache(
        n_layers=runner.cfg.n_layers,
        n_kv_heads=runner.cfg.n_kv_heads,
        head_dim=runner.cfg.head_dim,
        max_seq=len(ids),
    )
    return runner.engine.forward(cache, np.asarray(ids, dtype=np.int64), all_logits=True)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("qtype", QTYPES)
def test_engine_matches_the_numpy_reference_at_every_position(
    tmp_path: Path, arch: str, qtype: str
) -> None:
    path = _model(arch, qtype, tmp_path)
    runner = load_llama(path, max_seq=32)
    assert runner.dequantised_tensors == {}
    want = all_logits(forward_from_gguf(path), IDS)
    got = _engine_all(runner, IDS)
    # Some models on random K-quant blocks (large weights) amplify float32 rounding: on Q6_K
    # the numpy forward is 3.5e-5 (the mixtures) and 1.3e-4 (ERNIE 4.5) of the logit range from
    # a float64 forward over the same dequantised weights, the engine 9.4e-6 and 3.1e-5.
    rel = 2e-5
    if runner.cfg.n_experts:
        rel = 1e-4
    if (arch, qtype) == ("ernie4_5", "Q6_K"):
        rel = 2e-4
    tol = rel * float(np.abs(want).max()) + 1e-5
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)


@settings(max_examples=25, deadline=None)
@given(
    arch=st.sampled_from(ARCHS),
    chunk=st.integers(1, 9),
    split=st.integers(1, len(IDS) - 1),
    window=st.integers(1, 6),
)
def test_any_chunking_and_any_split_gives_the_logits_of_one_pass(
    tmp_path_factory: pytest.TempPathFactory, arch: str, chunk: int, split: int, window: int
) -> None:
    m = make_tiny(arch, seed=8, tie=arch == "qwen3")
    if arch in ("mistral", "gemma2", "gemma3"):
        m.config["sliding_window"] = window
    path = write_gguf(m, tmp_path_factory.mktemp("h") / "m.gguf")
    runner = load_llama(path, max_seq=32, chunk=chunk)
    whole = _engine_all(runner, IDS)
    got = [runner.prefill_logits(IDS[:split])]
    got += [runner.decode_logits(t) for t in IDS[split:]]
    np.testing.assert_allclose(np.stack(got), whole[split - 1 :], rtol=0, atol=2e-5)


# The mixtures: sequences of one step pick different experts.
@pytest.mark.parametrize("arch", ["qwen2", "qwen3moe", "qwen2moe", "mixtral", "granitemoe"])
@pytest.mark.parametrize("kv_dtype", ["float32", "float16"])
def test_a_batch_row_is_bit_identical_to_that_session_alone(
    tmp_path: Path, kv_dtype: str, arch: str
) -> None:
    path = write_gguf(make_tiny(arch, seed=4), tmp_path / "m.gguf", qtype="Q8_0")
    runner = load_llama(path, max_seq=32, kv_dtype=kv_dtype)  # type: ignore[arg-type]
    prompts = [IDS[:3], IDS[2:9], IDS[5:6], IDS[:3]]
    sessions = []
    for p in prompts:
        runner.prefill_logits(p)
        sessions.append(runner.export_session())
    tokens = [11, 12, 13, 11]
    logits, advanced = runner.decode_batch(sessions, tokens)
    for i, (s, t) in enumerate(zip(sessions, tokens, strict=True)):
        runner.restore_session(s)
        np.testing.assert_array_equal(logits[i], runner.decode_logits(t))
    np.testing.assert_array_equal(logits[0], logits[3])
    step2, _ = runner.decode_batch(advanced, [1, 2, 3, 4])
    runner.restore_session(advanced[1])
    np.testing.assert_array_equal(step2[1], runner.decode_logits(2))


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/status")
def test_kv_memory_grows_as_used_not_as_reserved(tmp_path: Path) -> None:
    def rss() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    path = write_gguf(make_tiny("llama", seed=1), tmp_path / "m.gguf")
    # 2 layers x 2 kv heads x 8 dims x 4 bytes x (k, v) = 256 bytes a token: 1M tokens reserve
    # 256 MiB of address space, of which a 12-token session may commit only a few pages.
    runner = load_llama(path, max_seq=1 << 20)
    before = rss()
    runner.prefill_logits(IDS)
    for t in IDS:
        runner.decode_logits(t)
    assert rss() - before < 32 * 2**20
    assert runner.export_session().kv.nbytes == 24 * 256


def test_a_type_without_a_kernel_is_dequantised_once_at_load_and_inspect_says_so(
    tmp_path: Path,
) -> None:
    import rlx_lm

    path = _model("llama", "TQ2_0", tmp_path)  # gguf.quants decodes TQ2_0; no kernel for it
    runner = load_llama(path, max_seq=32)
    assert set(runner.dequantised_tensors.values()) == {"TQ2_0"}
    assert "blk.0.attn_q.weight" in runner.dequantised_tensors
    want = all_logits(forward_from_gguf(path), IDS)
    np.testing.assert_allclose(
        _engine_all(runner, IDS), want, rtol=0, atol=2e-5 * float(np.abs(want).max()) + 1e-5
    )
    report = rlx_lm.inspect(path)
    assert "TQ2_0" in str(report.details["dequantised at load"])


def test_a_split_gguf_loads_from_its_first_shard(tmp_path: Path) -> None:
    from rlx_lm.errors import WeightFormatError

    m = make_tiny("qwen2", seed=6)
    whole = load_llama(write_gguf(m, tmp_path / "one.gguf"), max_seq=32)
    write_gguf(m, tmp_path / "m.gguf", split_max_tensors=8)
    shards = sorted(tmp_path.glob("m-*-of-*.gguf"))
    assert len(shards) > 2, shards
    split = load_llama(shards[0], max_seq=32)
    np.testing.assert_array_equal(split.prefill_logits(IDS), whole.prefill_logits(IDS))
    with pytest.raises(WeightFormatError, match="first shard"):
        load_llama(shards[1])
    shards[-1].unlink()
    with pytest.raises(WeightFormatError, match="missing"):
        load_llama(shards[0])
