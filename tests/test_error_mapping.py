"""Every error the Rust bindings raise is built in one place (rust/py/errors.rs), and one
input mistake gets one exception class whichever binding sees it."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from rlx_lm import DtypeError, KvCache, SampleOpts, SamplerChain, ShapeError, argmax
from rlx_lm._core import quant_matmul, quant_rows

RUST_PY = Path(__file__).resolve().parents[1] / "rust" / "py"
# Bindings still building exceptions themselves (to move onto the mapping): none left.
PENDING: set[str] = set()
# Bindings whose every entry point that can fail runs through catch_panics.
GUARDED = ("engine.rs", "kv.rs", "quant.rs", "sampling.rs")
# Bindings whose every entry point, fallible or not (getters, __repr__, pickling), does.
ALL_GUARDED = ("engine.rs", "kv.rs", "quant.rs", "sampling.rs")
# The entry points each of those has now: the scanner must find at least these many, so
# it cannot pass by missing them (quant.rs has only three free functions).
ENTRY_POINTS = {"engine.rs": 9, "kv.rs": 37, "quant.rs": 3, "sampling.rs": 26}


@pytest.mark.skipif(not RUST_PY.is_dir(), reason="needs the source tree")
def test_no_binding_builds_an_exception_itself() -> None:
    for path in sorted(RUST_PY.glob("*.rs")):
        if path.name in {"errors.rs", *PENDING}:
            continue
        text = path.read_text()
        assert not re.search(r"\w+(Error|Exception)::new_err\(", text), path.name
        assert "import_exception!" not in text, path.name


def _entry_points(text: str) -> list[tuple[str, str, str]]:
    """``(name, signature, body)`` of every function Python can call: the methods of a
    ``#[pymethods]`` block and each ``#[pyfunction]``."""
    lines = text.split("\n")
    found: list[tuple[str, str, str]] = []
    i, in_methods, pending_fn = 0, False, False
    while i < len(lines):
        line = lines[i]
        if line.startswith("#[pymethods]"):
            in_methods = True
        elif line.startswith("#[pyfunction]"):
            pending_fn = True
        elif in_methods and line == "}":
            in_methods = False
        m = re.match(r"^(\s*)(?:pub )?fn (\w+)", line)
        if m and ((in_methods and m.group(1) == "    ") or (pending_fn and not m.group(1))):
            pending_fn = False
            indent, j = m.group(1), i
            while not lines[j].rstrip().endswith("{"):
                j += 1
            k = j + 1
            while lines[k] != indent + "}":
                k += 1
            found.append((m.group(2), "\n".join(lines[i : j + 1]), "\n".join(lines[j + 1 : k])))
            i = k
        i += 1
    return found


@pytest.mark.skipif(not RUST_PY.is_dir(), reason="needs the source tree")
@pytest.mark.parametrize("name", GUARDED)
def test_every_entry_point_that_can_fail_catches_panics(name: str) -> None:
    """A panic reaching PyO3 becomes PanicException (a BaseException that escapes ``except
    Exception``); each entry point that does work runs its body through catch_panics so a
    core bug is an InternalError instead."""
    points = _entry_points((RUST_PY / name).read_text())
    assert points, name
    unguarded = [
        n
        for n, sig, body in points
        if "PyResult" in sig and not body.lstrip().startswith("catch_panics(")
    ]
    assert not unguarded, f"{name}: {unguarded}"


@pytest.mark.skipif(not RUST_PY.is_dir(), reason="needs the source tree")
@pytest.mark.parametrize("name", ALL_GUARDED)
def test_every_entry_point_catches_panics(name: str) -> None:
    """Getters, ``__repr__`` and pickling too: each returns a PyResult from catch_panics, so
    even a core bug in a trivial accessor is an InternalError, never a PanicException."""
    points = _entry_points((RUST_PY / name).read_text())
    assert len(points) >= ENTRY_POINTS[name], (name, [n for n, _, _ in points])
    unguarded = [
        n
        for n, sig, body in points
        if "PyResult" not in sig or not body.lstrip().startswith("catch_panics(")
    ]
    assert not unguarded, f"{name}: {unguarded}"


def test_the_entry_point_scanner_sees_unguarded_methods() -> None:
    """The scanner the guards rely on finds methods, getters and free functions, and tells
    a guarded body from an unguarded one (so the tests above cannot pass vacuously)."""
    text = """#[pymethods]
impl X {
    #[getter]
    fn step(&self) -> u64 {
        self.step
    }

    fn run(&self) -> PyResult<u32> {
        catch_panics(|| Ok(1))
    }
}

#[pyfunction]
pub fn free(a: u8) -> PyResult<()> {
    Ok(())
}
"""
    points = {n: body.lstrip().startswith("catch_panics(") for n, _, body in _entry_points(text)}
    assert points == {"step": False, "run": True, "free": False}


@pytest.mark.skipif(not RUST_PY.is_dir(), reason="needs the source tree")
def test_the_gil_is_released_only_through_the_one_helper() -> None:
    for path in sorted(RUST_PY.glob("*.rs")):
        if path.name != "gil.rs":
            assert ".detach(" not in path.read_text(), path.name


def _strided(n: int, dtype: str = "float32") -> np.ndarray:
    return np.zeros(2 * n, dtype)[::2]


def test_a_strided_view_is_a_dtype_error_in_every_binding() -> None:
    row = _strided(8)
    assert not row.flags.c_contiguous
    calls = [
        lambda: argmax(row),
        lambda: SamplerChain(SampleOpts.greedy()).sample(row),
        lambda: quant_matmul(
            np.zeros((4, 68), np.uint8)[:, ::2], 8, 64, np.zeros((1, 64), np.float32)
        ),
        lambda: quant_rows(np.zeros((4, 68), np.uint8)[:, ::2], 8, 64, np.array([0])),
    ]
    for call in calls:
        with pytest.raises(DtypeError, match="C-contiguous"):
            call()


def test_wrong_rank_is_a_shape_error_and_wrong_dtype_a_dtype_error_everywhere() -> None:
    cache = KvCache(n_layers=1, n_kv_heads=1, head_dim=2, max_seq=4)
    for call in (
        lambda: argmax(np.zeros((2, 2), np.float32)),
        lambda: cache.append(0, np.zeros(2, np.float32), np.zeros(2, np.float32)),
    ):
        with pytest.raises(ShapeError):
            call()
    for call in (
        lambda: argmax(np.zeros(2, np.float64)),
        lambda: cache.append(0, np.zeros((1, 1, 2)), np.zeros((1, 1, 2))),
        lambda: quant_matmul(np.zeros((4, 68), np.int8), 8, 64, np.zeros((1, 64), np.float32)),
    ):
        with pytest.raises(DtypeError):
            call()
    with pytest.raises(TypeError, match="restore needs a KvSnapshot"):
        cache.restore(object())
