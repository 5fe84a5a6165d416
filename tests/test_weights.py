"""WeightFormat detection, inspect() reports, and hostile or truncated files."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from weight_files import (
    gguf_bytes,
    safetensors_bytes,
    write_gguf,
    write_safetensors,
    write_zip,
)

import rlx_lm
from rlx_lm import InvalidOptionError, WeightFormat, WeightFormatError
from rlx_lm._headers import MAX_METADATA_ARRAY, MAX_OTHER_METADATA_ARRAY, read_gguf_header

F = WeightFormat

# -- parse and from_path -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("safetensors", F.SAFETENSORS),
        ("GGUF", F.GGUF),
        (" mlx ", F.MLX),
        ("npz", F.MLX),
        ("dduf", F.DDUF),
    ],
)
def test_parse_names(text: str, want: WeightFormat) -> None:
    assert WeightFormat.parse(text) is want


def test_parse_rejects_unknown_names() -> None:
    with pytest.raises(InvalidOptionError, match=r"safetensors\|gguf\|mlx\|dduf, got 'onnx'"):
        WeightFormat.parse("onnx")


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("m.safetensors", F.SAFETENSORS),
        ("m.GGUF", F.GGUF),
        ("m.npz", F.MLX),
        ("m.npy", F.MLX),
        ("m.dduf", F.DDUF),
    ],
)
def test_a_missing_file_is_judged_by_its_extension(
    tmp_path: Path, name: str, want: WeightFormat
) -> None:
    assert WeightFormat.from_path(tmp_path / "absent" / name) is want


def test_an_unknown_extension_on_a_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(WeightFormatError, match=r"m\.bin.*extension '\.bin'"):
        WeightFormat.from_path(tmp_path / "m.bin")


def test_content_decides_when_the_extension_is_missing_or_lies(tmp_path: Path) -> None:
    assert WeightFormat.from_path(write_gguf(tmp_path / "model")) is F.GGUF
    assert WeightFormat.from_path(write_gguf(tmp_path / "model.safetensors")) is F.GGUF
    assert WeightFormat.from_path(write_safetensors(tmp_path / "weights")) is F.SAFETENSORS
    assert WeightFormat.from_path(write_safetensors(tmp_path / "w.gguf")) is F.SAFETENSORS
    assert WeightFormat.from_path(write_zip(tmp_path / "pipe.bin", {"a": b""})) is F.DDUF
    np.savez(tmp_path / "arrays.npz", a=np.zeros(2))
    assert WeightFormat.from_path(tmp_path / "arrays.npz") is F.MLX
    np.save(tmp_path / "one", np.zeros(2))
    assert WeightFormat.from_path(tmp_path / "one.npy") is F.MLX


def test_content_that_contradicts_the_extension_is_an_error(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"<html>not a model</html>")
    with pytest.raises(
        WeightFormatError, match=r"model\.gguf: not a GGUF file \(first bytes b.<htm"
    ):
        WeightFormat.from_path(fake)
    blob = tmp_path / "blob"
    blob.write_bytes(b"\x00" * 64)
    with pytest.raises(WeightFormatError, match="cannot tell the weight format"):
        WeightFormat.from_path(blob)
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    with pytest.raises(WeightFormatError, match=r"empty\.safetensors: truncated .* 0 bytes"):
        WeightFormat.from_path(empty)


def test_directories(tmp_path: Path) -> None:
    mlx = tmp_path / "mlx"
    mlx.mkdir()
    (mlx / "config.json").write_text('{"model_type": "llama"}')
    write_safetensors(mlx / "model.safetensors")
    assert WeightFormat.from_path(mlx) is F.MLX

    ggufs = tmp_path / "ggufs"
    ggufs.mkdir()
    write_gguf(ggufs / "m-Q4_K_M.gguf")
    assert WeightFormat.from_path(ggufs) is F.GGUF

    no_config = tmp_path / "no_config"
    no_config.mkdir()
    write_safetensors(no_config / "model.safetensors")
    with pytest.raises(
        WeightFormatError, match=r"no_config: directory has safetensors .* no config"
    ):
        WeightFormat.from_path(no_config)

    with pytest.raises(WeightFormatError, match=r"no_config: directory has safetensors"):
        rlx_lm.inspect(no_config)

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(WeightFormatError, match=r"empty: directory is not a weight directory"):
        rlx_lm.inspect(empty)


# -- inspect: GGUF ---------------------------------------------------------------------


def test_inspect_gguf(tmp_path: Path) -> None:
    report = rlx_lm.inspect(write_gguf(tmp_path / "tiny.gguf", arch="Qwen3"))
    assert report.format is F.GGUF
    assert report.architecture == "Qwen3"
    assert report.tensor_count == 3
    assert report.dtypes == {"F16": 1, "F32": 1, "Q8_0": 1}
    assert report.tokenizer == "embedded (llama, 4 tokens)"
    assert report.has_tokenizer
    assert report.size_bytes == (tmp_path / "tiny.gguf").stat().st_size
    assert not report.sharded
    text = str(report)
    for needle in ("tiny.gguf", "gguf", "Qwen3", "3 (F16 x1, F32 x1, Q8_0 x1)", "single file"):
        assert needle in text


def test_the_header_walk_agrees_with_gguf_reader(tmp_path: Path) -> None:
    # gguf's own reader is the reference for names, types, shapes and data offsets.
    path = write_gguf(tmp_path / "m.gguf", alignment=64, extra={"custom.count": 7})
    ours = read_gguf_header(path)
    ref = gguf.GGUFReader(path)
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    assert [t.ggml_type for t in ours.tensors] == [int(t.tensor_type) for t in ref.tensors]
    assert [list(t.shape) for t in ours.tensors] == [t.shape.tolist() for t in ref.tensors]
    assert [ours.data_offset + t.offset for t in ours.tensors] == [
        t.data_offset for t in ref.tensors
    ]
    assert [t.n_bytes for t in ours.tensors] == [t.n_bytes for t in ref.tensors]
    arch = ref.get_field("general.architecture")
    # the raw parts, not ReaderField.contents(): the oldest gguf we allow (0.11) lacks it
    assert ours.metadata["general.architecture"] == bytes(arch.parts[arch.data[0]]).decode()
    assert ours.array_lengths["tokenizer.ggml.tokens"] == len(
        ref.get_field("tokenizer.ggml.tokens").data
    )


def test_inspect_split_gguf(tmp_path: Path) -> None:
    for i in (1, 2):
        write_gguf(
            tmp_path / f"m-0000{i}-of-00002.gguf",
            tensors={f"t{i}": np.zeros(4, np.float32)},
        )
    report = rlx_lm.inspect(tmp_path / "m-00001-of-00002.gguf")
    assert report.sharded
    assert [s.name for s in report.shards] == ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"]
    assert report.tensor_count == 2
    assert report.size_bytes == sum(s.stat().st_size for s in report.shards)
    assert "2 files" in str(report)


# -- inspect: safetensors, MLX, DDUF, npz ---------------------------------------------------


def test_inspect_safetensors_with_config_and_tokenizer(tmp_path: Path) -> None:
    path = write_safetensors(tmp_path / "model.safetensors")
    bare = rlx_lm.inspect(path)
    assert (bare.architecture, bare.tokenizer) == (None, None)
    assert "unknown" in str(bare)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "tokenizer.json").write_text("{}")
    report = rlx_lm.inspect(path)
    assert report.format is F.SAFETENSORS
    assert report.architecture == "llama"
    assert report.tokenizer == "tokenizer.json"
    assert report.tensor_count == 2
    assert report.dtypes == {"F16": 1, "F32": 1}


def test_inspect_sharded_mlx_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    (tmp_path / "tokenizer.model").write_bytes(b"spm")
    shards = [
        write_safetensors(tmp_path / f"model-0000{i}-of-00002.safetensors", seed=i) for i in (1, 2)
    ]
    weight_map = {f"layer{i}.weight": s.name for i, s in zip((1, 2), shards, strict=True)}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    report = rlx_lm.inspect(tmp_path)
    assert report.format is F.MLX
    assert report.architecture == "mistral"
    assert report.tokenizer == "tokenizer.model"
    assert report.tensor_count == 4
    assert report.shards == tuple(shards)
    assert report.size_bytes == sum(s.stat().st_size for s in shards)
    # One shard, inspected alone, still reports the whole set through the index.
    assert rlx_lm.inspect(shards[1]).shards == tuple(shards)


def test_a_missing_shard_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    write_safetensors(tmp_path / "a.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})
    )
    with pytest.raises(WeightFormatError, match=r"b\.safetensors: shard .* missing"):
        rlx_lm.inspect(tmp_path)


def test_inspect_dduf(tmp_path: Path) -> None:
    st = safetensors_bytes({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8)
    path = write_zip(
        tmp_path / "pipe.dduf",
        {
            "model_index.json": json.dumps({"_class_name": "FluxPipeline"}).encode(),
            "transformer/diffusion_pytorch_model.safetensors": st,
            "text_encoder/model.safetensors": st,
            "tokenizer/tokenizer.json": b"{}",
        },
    )
    report = rlx_lm.inspect(path)
    assert report.format is F.DDUF
    assert report.architecture == "FluxPipeline"
    assert report.tensor_count == 2
    assert report.tokenizer == "tokenizer/tokenizer.json"


def test_dduf_members_must_be_stored_and_valid(tmp_path: Path) -> None:
    st = safetensors_bytes({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8)
    with pytest.raises(WeightFormatError, match="compressed"):
        rlx_lm.inspect(write_zip(tmp_path / "a.dduf", {"m.safetensors": st}, stored=False))
    bad = safetensors_bytes({}, length=2**63)
    with pytest.raises(WeightFormatError, match=r"b\.dduf/m\.safetensors: .*header length"):
        rlx_lm.inspect(write_zip(tmp_path / "b.dduf", {"m.safetensors": bad}))


def test_inspect_npz(tmp_path: Path) -> None:
    np.savez(tmp_path / "w.npz", a=np.zeros(3, np.float32), b=np.zeros((2, 2), np.float16))
    report = rlx_lm.inspect(tmp_path / "w.npz")
    assert report.format is F.MLX
    assert report.tensor_count == 2
    assert report.dtypes == {"float16": 1, "float32": 1}


# -- hostile and truncated files ---------------------------------------------------------


def test_safetensors_header_length_two_to_the_63(tmp_path: Path) -> None:
    path = tmp_path / "evil.safetensors"
    path.write_bytes(struct.pack("<Q", 2**63) + b'{"a":1}')
    with pytest.raises(
        WeightFormatError, match=r"evil\.safetensors: .*header length 9223372036854775808"
    ):
        rlx_lm.inspect(path)


@pytest.mark.parametrize(
    ("header", "data", "pattern"),
    [
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, "truncated"),
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}, b"\0" * 8, "16 bytes"),
        ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}, b"", "invalid shape"),
        ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}}, b"", "data_offsets"),
        ({"w": {"shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, "no dtype"),
        ({"w": 3}, b"", "not an object"),
        ([1, 2], b"", "JSON object"),
    ],
)
def test_malformed_safetensors(tmp_path: Path, header: object, data: bytes, pattern: str) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(safetensors_bytes(header, data))
    with pytest.raises(WeightFormatError, match=pattern):
        rlx_lm.inspect(path)


def test_safetensors_header_that_is_not_json(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", 5) + b"{nope")
    with pytest.raises(WeightFormatError, match="not valid JSON"):
        rlx_lm.inspect(path)


_STR = 8
_ARRAY = 9


@pytest.mark.parametrize(
    ("raw", "pattern"),
    [
        (gguf_bytes(2**62), "claims 4611686018427387904 tensors"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 2**40), "claims 1099511627776 metadata entries"),
        (
            gguf_bytes(0, [("v", _ARRAY, struct.pack("<IQ", 0, 2**60))]),
            f"claims 1152921504606846976 items \\(limit {MAX_OTHER_METADATA_ARRAY}\\)",
        ),
        (
            gguf_bytes(0, [("tokenizer.v", _ARRAY, struct.pack("<IQ", 0, 2**60))]),
            f"claims 1152921504606846976 items \\(limit {MAX_METADATA_ARRAY}\\)",
        ),
        (gguf_bytes(0, [("v", _ARRAY, struct.pack("<IQ", 0, 1000))]), "1000 items"),
        (
            gguf_bytes(0, [("tokenizer.v", _ARRAY, struct.pack("<IQ", _STR, 10**6))]),
            "room for at most",
        ),
        (gguf_bytes(0, [("s", _STR, struct.pack("<Q", 2**62))]), "value of 's'"),
        (gguf_bytes(0, [("s", 99, b"\0" * 8)]), "unknown value type 99"),
        (gguf_bytes(0, version=1), "unsupported GGUF version 1"),
        (gguf_bytes(0, [("s", _STR, struct.pack("<Q", 2) + b"\xff\xfe")]), "not valid UTF-8"),
        (b"GGUF\x03\x00", "fixed part needs 24"),
        (b"GGML", "not a GGUF file"),
    ],
)
def test_hostile_gguf_headers(tmp_path: Path, raw: bytes, pattern: str) -> None:
    path = tmp_path / "evil.gguf"
    path.write_bytes(raw + (b"\0" * 64 if len(raw) > 8 else b""))
    with pytest.raises(WeightFormatError, match=pattern) as info:
        rlx_lm.inspect(path)
    assert str(info.value).startswith(str(path))


def _tensor_info(name: str, dims: list[int], ggml_type: int, offset: int) -> bytes:
    return (
        struct.pack("<Q", len(name))
        + name.encode()
        + struct.pack("<I", len(dims))
        + struct.pack(f"<{len(dims)}Q", *dims)
        + struct.pack("<IQ", ggml_type, offset)
    )


@pytest.mark.parametrize(
    ("info", "pattern"),
    [
        (_tensor_info("t", [2**40, 2**40], 0, 0), "more than the whole file"),
        (_tensor_info("t", [1, 1, 1, 1, 1], 0, 0), "5 dimensions"),
        (_tensor_info("t", [4], 12345, 0), "unknown GGML type 12345"),
        (_tensor_info("t", [33], int(gguf.GGMLQuantizationType.Q8_0), 0), "block size 32"),
        (_tensor_info("t", [4], 0, 3), "not aligned"),
        (
            _tensor_info("t", [16], 0, 0),
            "truncated: tensor 't' needs bytes up to 128, but the file has 121",
        ),
    ],
)
def test_hostile_gguf_tensor_infos(tmp_path: Path, info: bytes, pattern: str) -> None:
    path = tmp_path / "evil.gguf"
    path.write_bytes(gguf_bytes(1, tail=info) + b"\0" * 64)
    with pytest.raises(WeightFormatError, match=pattern):
        rlx_lm.inspect(path)


def test_a_hostile_count_in_a_huge_sparse_file_fails_without_reading_it(tmp_path: Path) -> None:
    path = tmp_path / "sparse.gguf"
    with open(path, "wb") as f:
        f.write(gguf_bytes(0, [("v", _ARRAY, struct.pack("<IQ", _STR, 2**40))]))
        f.truncate(8 << 30)  # 8 GiB of holes: reading it would take far longer than this test
    with pytest.raises(WeightFormatError, match="limit"):
        rlx_lm.inspect(path)


@pytest.mark.parametrize("kind", ["gguf", "safetensors"])
def test_every_truncation_is_a_format_error(tmp_path: Path, kind: str) -> None:
    whole = tmp_path / f"whole.{kind}"
    write_gguf(whole) if kind == "gguf" else write_safetensors(whole)
    data = whole.read_bytes()
    if kind == "gguf":
        # The writer pads after the last tensor; cutting padding loses nothing.
        header = read_gguf_header(whole)
        data = data[: max(header.data_offset + t.offset + t.n_bytes for t in header.tensors)]
    cut = tmp_path / f"cut.{kind}"
    for n in range(len(data)):
        cut.write_bytes(data[:n])
        with pytest.raises(WeightFormatError, match="cut"):
            rlx_lm.inspect(cut)
    cut.write_bytes(data)
    assert rlx_lm.inspect(cut).tensor_count == rlx_lm.inspect(whole).tensor_count


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.parametrize("kind", ["gguf", "safetensors"])
def test_corrupted_bytes_never_escape_as_other_errors(
    tmp_path: Path, kind: str, data: st.DataObject
) -> None:
    whole = tmp_path / f"whole.{kind}"
    if not whole.exists():
        write_gguf(whole) if kind == "gguf" else write_safetensors(whole)
    raw = bytearray(whole.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    mutated = tmp_path / f"mutated.{kind}"
    mutated.write_bytes(bytes(raw))
    try:
        report = rlx_lm.inspect(mutated)
    except WeightFormatError as exc:
        message = str(exc)
    else:
        message = str(mutated) if report.tensor_count >= 0 else ""
    assert message.startswith(str(mutated))
