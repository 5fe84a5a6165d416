"""`rlx_lm._headers`: the GGML type table, the cache of GGUF headers read without arrays,
and string arrays walked by the core a chunk at a time."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from model_factory import make_tiny, write_gguf
from tokenizer_factory import bpe_gguf_fields, train_bpe

from rlx_lm import WeightFormatError, _headers
from rlx_lm._headers import GGML_TYPES, ggml_type, read_gguf_header


def test_our_ggml_type_table_agrees_with_gguf_py() -> None:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    both = 0
    for qt in GGMLQuantizationType:
        if int(qt) in GGML_TYPES and qt in GGML_QUANT_SIZES:
            assert GGML_TYPES[int(qt)] == (qt.name, *GGML_QUANT_SIZES[qt]), qt
            both += 1
    assert both >= 30
    assert ggml_type(2) == ("Q4_0", 32, 18)
    assert ggml_type(10**6) is None


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "m.gguf"
    write_gguf(make_tiny(vocab=300), path, tokenizer=bpe_gguf_fields(train_bpe()))
    return path


def _count_walks(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    walks: list[Path] = []
    real = _headers._walk_gguf

    def walk(buf: memoryview, path: Path, wanted: object = frozenset()) -> object:
        walks.append(path)
        return real(buf, path, wanted)  # type: ignore[arg-type]

    monkeypatch.setattr(_headers, "_walk_gguf", walk)
    return walks


def test_a_header_read_again_comes_from_the_cache(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    walks = _count_walks(monkeypatch)
    first = read_gguf_header(model)
    again = read_gguf_header(model)
    assert len(walks) == 1
    assert again == first
    again.metadata["general.architecture"] = "mutated"  # a caller's dict is its own
    assert read_gguf_header(model).metadata["general.architecture"] == "llama"
    # arrays are never cached: the tokenizer's read walks the file (and refreshes the cache)
    tokens = read_gguf_header(model, arrays=["tokenizer.ggml.tokens"])
    assert len(walks) == 2
    assert tokens.arrays["tokenizer.ggml.tokens"]
    assert read_gguf_header(model).arrays == {}
    assert len(walks) == 2


def test_a_header_changed_in_place_is_read_again(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    walks = _count_walks(monkeypatch)
    assert read_gguf_header(model).metadata["general.architecture"] == "llama"
    data = model.read_bytes()
    at = data.index(b"llama", data.index(b"general.architecture"))
    # same size, rewritten at once (the modification time may not even tick)
    model.write_bytes(data[:at] + b"llamb" + data[at + 5 :])
    assert read_gguf_header(model).metadata["general.architecture"] == "llamb"
    assert len(walks) == 2
    # a file whose header breaks is refused, not served from the cache
    model.write_bytes(data[:8] + b"\xff" * 8 + data[16:])
    with pytest.raises(WeightFormatError, match=r"claims \d+ (tensors|metadata)"):
        read_gguf_header(model)


def test_loading_a_model_neither_imports_gguf_py_nor_walks_the_header_repeatedly(
    model: Path,
) -> None:
    # Who imports gguf-py is recorded (a plugin found through entry points may, as the
    # example third-party runner does); rlx_lm itself must not.
    code = (
        "import sys, traceback\n"
        "importers = []\n"
        "class Spy:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'gguf':\n"
        "            stack = [f.filename for f in traceback.extract_stack()]\n"
        "            importers.append([f for f in stack if 'importlib' not in f][-2])\n"
        "        return None\n"
        "sys.meta_path.insert(0, Spy())\n"
        "import rlx_lm\n"
        "from rlx_lm import _headers\n"
        "walks = []\n"
        "real = _headers._walk_gguf\n"
        "_headers._walk_gguf = lambda *a: walks.append(1) or real(*a)\n"
        "rlx_lm.load_model(sys.argv[1], max_seq=32)\n"
        "ours = [f for f in importers if '/rlx_lm/' in f.replace(chr(92), '/')]\n"
        "print(len(ours), len(walks))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(model)], capture_output=True, text=True, check=True
    )
    ours, walks = out.stdout.split()
    assert ours == "0", out.stdout
    assert int(walks) <= 2  # the header once, the tokenizer's arrays once


# ------------------------------------------- string arrays, walked by the core a chunk at a time

_TEXT = st.text(alphabet="ab é日\0\n", max_size=40)


def _encode(items: list[bytes], order: str) -> bytes:
    return b"".join(struct.pack(order + "Q", len(b)) + b for b in items)


def _cursor(data: bytes, order: str) -> Any:
    return _headers._Cursor(memoryview(data), Path("x.gguf"), order)


@settings(max_examples=150, deadline=None)
@given(
    items=st.lists(_TEXT, max_size=30),
    chunk=st.sampled_from([9, 16, 64, 1 << 20]),
    order=st.sampled_from(["<", ">"]),
    tail=st.binary(max_size=12),
)
def test_string_arrays_read_as_a_plain_walk_reads_them(
    items: list[str], chunk: int, order: str, tail: bytes
) -> None:
    data = _encode([s.encode() for s in items], order) + tail
    saved = _headers._CHUNK
    _headers._CHUNK = chunk  # strings across and beyond chunk ends
    try:
        cur = _cursor(data, order)
        assert _headers._read_strings(cur, "k", len(items)) == items
        end = cur.pos
        assert end == len(data) - len(tail)
        cur = _cursor(data, order)
        assert _headers._read_strings(cur, "k", len(items), keep=False) == []
        assert cur.pos == end
    finally:
        _headers._CHUNK = saved


@settings(max_examples=100, deadline=None)
@given(items=st.lists(_TEXT, min_size=1, max_size=12), cut=st.integers(0, 10**6))
def test_a_truncated_string_array_names_the_first_item_cut(items: list[str], cut: int) -> None:
    raw = [s.encode() for s in items]
    data = _encode(raw, "<")
    cut %= len(data)
    # the reference: where each item's prefix and bytes end
    at, first_cut, what = 0, None, ""
    for i, b in enumerate(raw):
        if at + 8 > cut:
            first_cut, what = i, f"length of item {i} of 'k'"
            break
        if at + 8 + len(b) > cut:
            first_cut, what = i, f"item {i} of 'k'"
            break
        at += 8 + len(b)
    cur = _cursor(data[:cut] + b"", "<")
    if first_cut is None:
        assert _headers._read_strings(cur, "k", len(items)) == items
        return
    # the room check may refuse a count first; otherwise the cut item is named
    with pytest.raises(WeightFormatError) as err:
        _headers._read_strings(cur, "k", len(items))
    msg = str(err.value)
    assert what in msg or "claims" in msg, (msg, what)


def test_a_string_that_is_not_utf8_is_named() -> None:
    data = _encode([b"ok", b"\xff", b"fine"], "<")
    with pytest.raises(WeightFormatError, match="item 1 of 'k' is not valid UTF-8"):
        _headers._read_strings(_cursor(data, "<"), "k", 3)
    cur = _cursor(data, "<")
    assert _headers._read_strings(cur, "k", 3, keep=False) == []  # skipped unread
    assert cur.pos == len(data)
