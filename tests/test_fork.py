"""A process forked after the library started its threads works in the child.

`fork()` keeps only the calling thread: the engine's team, its rayon pool,
the pools of `quant_matmul` and the shared pool behind `sample_batch` have no
threads in the child. Before they were kept per process, the child's first
decode step waited forever. Each part is used in the parent first (so its
threads exist before the fork), then in the child, which must give the
parent's answers within a time limit.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import gguf
import numpy as np
import pytest
from gguf.quants import quantize

from rlx_lm import SampleOpts, load_default
from rlx_lm._core import quant_matmul

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

LIMIT_S = 120.0


def in_forked_child(work: Callable[[], Any]) -> Any:
    """`work()` run in a forked child; its JSON result, or a failure naming a hang."""
    # The result goes through a file: a pipe would block a child whose result
    # is larger than the pipe's buffer while the parent waits for it to exit.
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    with warnings.catch_warnings():
        # Python 3.12+ warns that forking a threaded process may deadlock:
        # that is what this test checks does not happen.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            payload = json.dumps({"ok": work()})
        except BaseException:
            payload = json.dumps({"error": traceback.format_exc()})
            code = 1
        with open(path, "w") as out:
            out.write(payload)
        os._exit(code)
    deadline = time.monotonic() + LIMIT_S
    while True:
        done, _status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.unlink(path)
            pytest.fail(f"the forked child hung (killed after {LIMIT_S:.0f} s)")
        time.sleep(0.05)
    with open(path) as got:
        result = json.loads(got.read() or '{"error": "no output"}')
    os.unlink(path)
    assert "error" not in result, result["error"]
    return result["ok"]


def test_a_loaded_engine_decodes_in_a_forked_child() -> None:
    runner, _ = load_default(max_seq=64, threads=2)

    def greedy() -> list[int]:
        logits = runner.prefill_logits([1, 5, 9, 2])
        out = []
        for _ in range(6):
            token = int(np.argmax(logits))
            out.append(token)
            logits = runner.decode_logits(token)
        return out

    want = greedy()  # the team and the engine's pool are running now
    assert in_forked_child(greedy) == want
    assert greedy() == want  # and the parent's threads still work


def test_sample_batch_and_quant_matmul_work_in_a_forked_child() -> None:
    rng = np.random.default_rng(0)
    # Large enough (rows x vocab >= 2**20) to take the parallel path.
    rows = rng.standard_normal((4, 300_000)).astype(np.float32)
    chain = SampleOpts(temperature=1.0, seed=3).into_chain()
    cols = 1024
    w = rng.standard_normal((700, cols)).astype(np.float32)
    raw = quantize(w, gguf.GGMLQuantizationType.Q8_0)
    x = rng.standard_normal((3, cols)).astype(np.float32)
    q8 = int(gguf.GGMLQuantizationType.Q8_0)

    def work() -> dict[str, Any]:
        return {
            "batch": chain.sample_batch(rows, advance=False).tolist(),
            "shared": quant_matmul(raw, q8, cols, x).tolist(),
            "two": quant_matmul(raw, q8, cols, x, threads=2).tolist(),
        }

    want = work()  # every pool has its threads now
    assert in_forked_child(work) == want
