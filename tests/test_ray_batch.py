"""Batch generation on a real local Ray cluster: complete, ordered, the same for any actors."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from rlx_lm import SampleOpts, generate, load_default  # noqa: E402
from rlx_lm.ray import generate as ray_generate  # noqa: E402
from rlx_lm.ray import row_sequence_id  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")

OPTS = SampleOpts(temperature=0.9, top_k=40, top_p=0.95)
WORDS = ["the", "a", "old", "river", "king", "small", "house", "night", "said", "ran"]


def _prompts(n: int) -> list[str]:
    return [" ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 2 + i % 4)) for i in range(n)]


def _rows(n: int) -> list[dict[str, Any]]:
    return [{"id": i, "prompt": p} for i, p in enumerate(_prompts(n))]


def test_complete_ordered_and_the_same_for_any_actor_count_and_blocks() -> None:
    rows = _rows(240)
    one = ray_generate(
        ray.data.from_items(rows), opts=OPTS, seed=11, max_tokens=4, num_actors=1, batch_size=32
    ).take_all()
    two = ray_generate(
        ray.data.from_items(rows).repartition(7),
        opts=OPTS,
        seed=11,
        max_tokens=4,
        num_actors=2,
        batch_size=5,
    ).take_all()
    assert [r["id"] for r in one] == list(range(240))
    assert [r["id"] for r in two] == list(range(240))
    # Another input order: each row's text still depends only on its id.
    rev = ray_generate(
        ray.data.from_items(rows[::-1]), opts=OPTS, seed=11, max_tokens=4, batch_size=9
    ).take_all()
    assert [r["id"] for r in rev] == list(range(239, -1, -1))
    assert {r["id"]: r["text"] for r in rev} == {r["id"]: r["text"] for r in one}
    assert [r["text"] for r in one] == [r["text"] for r in two]
    assert [list(r["tokens"]) for r in one] == [list(r["tokens"]) for r in two]
    assert {r["stop_reason"] for r in one} <= {"length", "eos", "stop"}
    # The seed matters: another seed changes some rows.
    other = ray_generate(
        ray.data.from_items(rows[:40]), opts=OPTS, seed=12, max_tokens=4, batch_size=40
    ).take_all()
    assert [r["text"] for r in other] != [r["text"] for r in one[:40]]


def test_a_row_is_what_local_generation_gives_with_its_id_as_sequence_id() -> None:
    runner, tok = load_default()
    rows = [{"id": 1000 + i, "prompt": p} for i, p in enumerate(_prompts(6))]
    got = ray_generate(rows_ds := ray.data.from_items(rows), opts=OPTS, seed=5, max_tokens=8)
    assert rows_ds.count() == 6
    for r in got.take_all():
        local = generate(
            runner,
            tok,
            rows[r["id"] - 1000]["prompt"],
            opts=OPTS,
            seed=5,
            max_tokens=8,
            sequence_id=row_sequence_id(r["id"]),
        )
        assert r["text"] == local.text
        assert list(r["tokens"]) == local.tokens


def test_plain_list_string_ids_and_logprobs() -> None:
    out = ray_generate(_prompts(5), max_tokens=4, logprobs=0).take_all()
    assert [r["id"] for r in out] == [0, 1, 2, 3, 4]
    for r in out:
        assert len(r["logprobs"]) == len(r["tokens"])
        assert all(lp <= 0.0 for lp in r["logprobs"])
    named = ray_generate(
        ray.data.from_items([{"id": f"q{i}", "prompt": p} for i, p in enumerate(_prompts(3))]),
        max_tokens=3,
    ).take_all()
    assert [r["id"] for r in named] == ["q0", "q1", "q2"]
    assert row_sequence_id("q1") == row_sequence_id("q1") != row_sequence_id("q2")


def _generation_actor_pids() -> list[int]:
    """Processes Ray titled after our actor (``ray::MapWorker(MapBatches(_Generate))...``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.startswith(b"ray::") and b"_Generate" in cmdline:
            pids.append(int(entry.name))
    return pids


def _held_until(flag: str, from_id: int) -> Any:
    """A row map that holds rows ``id >= from_id`` until ``flag`` exists (at most 300 s).

    The engine can finish the whole job in less time than it takes to find an actor's
    pid, so the test holds the job open instead of hoping it is still running."""

    def hold(row: dict[str, Any]) -> dict[str, Any]:
        if row["id"] >= from_id:
            deadline = time.monotonic() + 300
            while not os.path.exists(flag) and time.monotonic() < deadline:
                time.sleep(0.05)
        return row

    return hold


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs Linux /proc")
def test_an_actor_killed_mid_job_costs_no_row(tmp_path: Path) -> None:
    rows = _rows(300)
    result: dict[str, Any] = {}
    flag = str(tmp_path / "release")

    def run() -> None:
        data = ray.data.from_items(rows).map(_held_until(flag, 150))
        result["rows"] = ray_generate(
            data, opts=OPTS, seed=3, max_tokens=16, num_actors=2, batch_size=8
        ).take_all()

    before = set(_generation_actor_pids())
    job = threading.Thread(target=run)
    job.start()
    deadline = time.monotonic() + 120
    victim = None
    while victim is None and time.monotonic() < deadline and job.is_alive():
        fresh = sorted(set(_generation_actor_pids()) - before)
        if fresh:
            time.sleep(1.0)  # let it take a batch or two
            victim = fresh[0]
        else:
            time.sleep(0.2)
    assert victim is not None, "no generation actor appeared"
    assert job.is_alive(), "the job is held open until the flag exists"
    os.kill(victim, signal.SIGKILL)
    Path(flag).touch()
    job.join(timeout=600)
    assert not job.is_alive()
    out = result["rows"]
    assert [r["id"] for r in out] == list(range(300))
    expected = ray_generate(
        ray.data.from_items(rows[:50]), opts=OPTS, seed=3, max_tokens=16, batch_size=50
    ).take_all()
    assert [r["text"] for r in out[:50]] == [r["text"] for r in expected]


def test_bad_arguments_are_refused_before_any_work() -> None:
    from rlx_lm import InvalidOptionError

    with pytest.raises(InvalidOptionError, match="num_actors"):
        ray_generate(["x"], num_actors=0)
    with pytest.raises(InvalidOptionError, match="dataset must be"):
        ray_generate("just a string")  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="row ids"):
        row_sequence_id(1.5)
