"""Hostile and malformed models at the public entry points: build(), load_model, inspect, CLI.

One test per trigger of issue 16's loading findings: a small GGUF that cost
build() gigabytes, vocabulary arrays of the wrong type, shard indexes naming
files outside the model directory, JSON nested past the recursion limit, and
malformed configurations that raised untyped exceptions (and CLI tracebacks).
"""

from __future__ import annotations

import ast
import json
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from model_factory import make_tiny, write_gguf, write_safetensors_dir
from tokenizer_factory import spm_gguf_fields, spm_vocab

import rlx_lm
from rlx_lm import LmRunnerBuilder, WeightFormatError
from rlx_lm._headers import (
    MAX_OTHER_METADATA_ARRAY,
    read_gguf_header,
    read_safetensors_index,
)
from rlx_lm.generation import load_model

TOKENS, _, _ = spm_vocab()


def _gguf_with(path: Path, extra: dict[str, Any], tokenizer: dict[str, Any] | None = None) -> Path:
    """A valid tiny llama GGUF plus ``extra`` metadata (written through gguf's writer)."""
    add_vocab_size = gguf.GGUFWriter.add_vocab_size

    def add_more(self: gguf.GGUFWriter, n: int) -> None:
        add_vocab_size(self, n)
        for key, value in extra.items():
            self.add_array(key, value)

    gguf.GGUFWriter.add_vocab_size = add_more  # type: ignore[method-assign]
    try:
        return write_gguf(make_tiny("llama", seed=3, vocab=len(TOKENS)), path, tokenizer=tokenizer)
    finally:
        gguf.GGUFWriter.add_vocab_size = add_vocab_size  # type: ignore[method-assign]


def _peak_bytes(fn: Any) -> int:
    tracemalloc.start()
    try:
        fn()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


def test_a_small_gguf_with_a_long_junk_array_is_refused_before_any_loader_runs(
    tmp_path: Path,
) -> None:
    # 2 MB: two million one-byte items, which gguf.GGUFReader turns into ~1.4 GB of
    # Python objects (26 s) before anything looks at them.
    path = _gguf_with(tmp_path / "junk.gguf", {"general.junk": [True] * 2_000_000})
    assert path.stat().st_size < 2_200_000

    def build() -> None:
        with pytest.raises(WeightFormatError, match=r"'general\.junk' claims 2000000 items"):
            LmRunnerBuilder().weights(path).build()

    assert _peak_bytes(build) < 16 << 20
    with pytest.raises(WeightFormatError, match=f"limit {MAX_OTHER_METADATA_ARRAY}"):
        rlx_lm.inspect(path)
    with pytest.raises(WeightFormatError):
        load_model(path)


@pytest.mark.parametrize(
    ("fields", "pattern"),
    [
        ({"tokenizer.ggml.token_type": [True] * 8}, "must be an array of int32"),
        ({"tokenizer.ggml.scores": [1] * 8}, "must be an array of float32"),
        ({"tokenizer.ggml.tokens": [1, 2]}, "must be an array of strings"),
    ],
)
def test_vocabulary_arrays_of_the_wrong_type_are_refused(
    tmp_path: Path, fields: dict[str, Any], pattern: str
) -> None:
    path = _gguf_with(tmp_path / "m.gguf", fields)
    with pytest.raises(WeightFormatError, match=pattern):
        LmRunnerBuilder().weights(path).build()


def test_vocabulary_arrays_of_other_lengths_than_the_tokens_are_refused(tmp_path: Path) -> None:
    tok = spm_gguf_fields()
    tok["tokenizer.ggml.scores"] = tok["tokenizer.ggml.scores"][:-1]
    path = write_gguf(
        make_tiny("llama", seed=3, vocab=len(TOKENS)), tmp_path / "m.gguf", tokenizer=tok
    )
    with pytest.raises(WeightFormatError, match="scores' has 344 items for 345 tokens"):
        rlx_lm.inspect(path)


def _reader_array(field: Any) -> list[Any]:
    """An array field from gguf's raw parts (ReaderField.contents() is newer than gguf 0.11)."""
    if field.types[-1] == gguf.GGUFValueType.STRING:
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    return [field.parts[i].tolist()[0] for i in field.data]


def test_the_walker_decodes_requested_arrays_as_gguf_reader_does(tmp_path: Path) -> None:
    path = write_gguf(
        make_tiny("llama", seed=3, vocab=len(TOKENS)),
        tmp_path / "m.gguf",
        tokenizer=spm_gguf_fields(),
    )
    header = read_gguf_header(path, arrays=True)
    reader = gguf.GGUFReader(path)
    assert set(header.arrays) == set(header.array_lengths)
    for key, value in header.arrays.items():
        got = value if isinstance(value, list) else value.tolist()
        assert got == _reader_array(reader.get_field(key)), key
    only = read_gguf_header(path, arrays=["tokenizer.ggml.scores"])
    assert set(only.arrays) == {"tokenizer.ggml.scores"}
    assert only.arrays["tokenizer.ggml.scores"].dtype == np.float32


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return write_safetensors_dir(make_tiny("llama", seed=5, vocab=32), tmp_path / "model")


def _index(directory: Path, names: list[str]) -> None:
    weights = sorted(p.name for p in directory.glob("*.safetensors"))
    wmap = {f"t{i}": n for i, n in enumerate(names)}
    wmap.update({f"real{i}": n for i, n in enumerate(weights)})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wmap}))


@pytest.mark.parametrize(
    "name", ["../outside.safetensors", "/etc/passwd", "sub/x.safetensors", "..", "a\\..\\b"]
)
def test_shard_indexes_naming_files_outside_the_model_directory_are_refused(
    model_dir: Path, name: str
) -> None:
    outside = model_dir.parent / "outside.safetensors"
    outside.write_bytes(
        (
            model_dir / next(iter(sorted(p.name for p in model_dir.glob("*.safetensors"))))
        ).read_bytes()
    )
    _index(model_dir, [name])
    for call in (
        lambda: LmRunnerBuilder().weights(model_dir).build(),
        lambda: load_model(model_dir),
        lambda: rlx_lm.inspect(model_dir),
        lambda: read_safetensors_index(model_dir),
    ):
        with pytest.raises(WeightFormatError, match="outside the model directory"):
            call()
    from rlx_lm.runners.llama import load_llama

    with pytest.raises(WeightFormatError, match="outside the model directory"):
        load_llama(model_dir)


def test_deeply_nested_json_is_a_format_error_everywhere(model_dir: Path, tmp_path: Path) -> None:
    nested = "[" * 100_000
    (model_dir / "config.json").write_text(nested)
    with pytest.raises(WeightFormatError, match="too deeply"):
        LmRunnerBuilder().weights(model_dir).build()
    st = tmp_path / "nested.safetensors"
    st.write_bytes(struct.pack("<Q", len(nested)) + nested.encode())
    with pytest.raises(WeightFormatError, match="too deeply"):
        rlx_lm.inspect(st)


@pytest.mark.parametrize(
    "change",
    [
        {"num_attention_heads": 0},  # ZeroDivisionError in the loader
        {"num_key_value_heads": "many"},  # ValueError from int()
        {"rms_norm_eps": [1]},  # TypeError from float()
    ],
)
def test_malformed_configurations_raise_typed_errors_and_the_cli_says_so(
    model_dir: Path, change: dict[str, Any]
) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(rlx_lm.RlxError):
        LmRunnerBuilder().weights(model_dir).build()
    done = subprocess.run(
        [sys.executable, "-m", "rlx_lm.cli", "generate", str(model_dir), "-p", "hi", "-n", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("rlx-lm: error:")


GENERIC = [
    "builder.py",
    "cli.py",
    "generation.py",
    "prompt_cache.py",
    "registry.py",
    "runner.py",
    "session.py",
    "weights.py",
    "weight_report.py",
    "progress.py",
    "config.py",
    "host_driven.py",
]


@pytest.mark.parametrize("name", GENERIC)
def test_generic_modules_never_import_the_reference_family(name: str) -> None:
    source = Path(rlx_lm.__file__).parent / name
    tree = ast.parse(source.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert not (node.module or "").startswith("rlx_lm.runners"), (name, node.module)
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("rlx_lm.runners") for a in node.names), name


def _import_graph() -> dict[str, set[str]]:
    """rlx_lm module -> rlx_lm modules it imports anywhere (functions too), except for
    type checking only."""
    root = Path(rlx_lm.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        mod = ".".join(("rlx_lm", *path.relative_to(root).with_suffix("").parts))
        mod = mod.removesuffix(".__init__")
        found: set[str] = set()

        def visit(node: ast.AST, found: set[str] = found) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    for other in child.orelse:
                        visit(other)
                    continue
                if isinstance(child, ast.ImportFrom) and (child.module or "").startswith("rlx_lm"):
                    base = child.module or ""
                    # `from package import submodule` depends on the submodule
                    found.update(f"{base}.{a.name}" for a in child.names)
                    found.add(base)
                elif isinstance(child, ast.Import):
                    found.update(a.name for a in child.names if a.name.startswith("rlx_lm"))
                visit(child)

        visit(ast.parse(path.read_text()))
        graph[mod] = found
    # A package's own submodules importing it (or its names) is how packages work.
    return {
        m: {d for d in deps if d in graph and d != m and not m.startswith(d + ".")}
        for m, deps in graph.items()
    }


def test_no_import_cycles_in_the_package() -> None:
    """builder -> registry -> runners.llama -> builder was one; none may come back."""
    graph = _import_graph()
    state: dict[str, int] = {}

    def visit(mod: str, path: list[str]) -> None:
        state[mod] = 1
        for dep in sorted(graph[mod]):
            assert state.get(dep) != 1, " -> ".join([*path, mod, dep])
            if dep not in state:
                visit(dep, [*path, mod])
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [])


def test_importing_the_library_loads_no_family() -> None:
    code = (
        "import sys, rlx_lm, rlx_lm.cli, rlx_lm.generation, rlx_lm.builder, rlx_lm.registry\n"
        "bad = sorted(m for m in sys.modules if m.startswith('rlx_lm.runners'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_families_do_not_import_what_builds_them() -> None:
    """The registry imports the built-in families by name (BUILTIN_RUNNERS); a family that
    imported the builder back closed builder -> registry -> runners.llama -> builder."""
    graph = _import_graph()
    for mod, deps in graph.items():
        if mod.startswith("rlx_lm.runners"):
            assert not deps & {"rlx_lm.builder", "rlx_lm.generation", "rlx_lm.cli"}, mod


def test_the_library_reads_gguf_through_its_own_reader_only() -> None:
    """One reader per format (issue 15): no module of rlx_lm uses gguf.GGUFReader, which
    trusts its input (the 2^40-item array that hung it is in test_tokenizer.py); every GGUF
    header goes through the bounds-checked walker of rlx_lm._headers."""
    package = Path(rlx_lm.__file__).parent
    users = []
    for source in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            named = (isinstance(node, ast.Name) and node.id == "GGUFReader") or (
                isinstance(node, ast.Attribute) and node.attr == "GGUFReader"
            )
            imported = isinstance(node, ast.ImportFrom) and any(
                a.name == "GGUFReader" for a in node.names
            )
            if named or imported:
                users.append(str(source.relative_to(package)))
    assert users == []
