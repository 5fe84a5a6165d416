"""The release extension's machine code: no SIMD intrinsic left as an out-of-line call.

An intrinsic is inlined only into code compiled with its target features. One that ends up
in code compiled without them (a helper that is not ``#[inline(always)]``, a closure given to
``array::map``, a function value called through a shim) becomes a ``call`` to
``core::core_arch::...``, and the caller spills its vector registers around every call. Two
such cases cost the AVX-512 exact kernels 5-10% (an AVX-512 DQ extract in the sum of a tile's
accumulators, where DQ is not enabled) and IQ4_XS's batched products 2.3-6x (its unpacking
called through a shim LLVM left out of line). The symbols are in the wheel, so the disassembly
names every such call (the release profile keeps them: ``strip = "none"``, since zig, the
manylinux linker, turns rustc's default debug-info strip into a full one). A stripped build
has none and skips; ``RLX_CODEGEN_SO`` names another extension to read.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import rlx_lm
from rlx_lm import _core

# CPU feature detection runs `xgetbv` once per process, outside every kernel.
ALLOWED = {"core::core_arch::x86::xsave::_xgetbv"}
CALL = re.compile(r"\scall\s+[0-9a-f]+\s+<(core::core_arch::[^>]+)>")


def _disassembly() -> str:
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) is not installed")
    if rlx_lm.build_profile != "release" and not os.environ.get("RLX_CODEGEN_SO"):
        pytest.skip("not the release build, whose code ships")
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the x86 kernels only")
    so = Path(os.environ.get("RLX_CODEGEN_SO") or _core.__file__)
    out = subprocess.run(
        [objdump, "-d", "--no-show-raw-insn", "-C", str(so)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if "core::core_arch" not in out and "rlx_lm::" not in out:
        pytest.skip("the extension has no symbols")
    return out


def test_no_simd_intrinsic_is_called_out_of_line() -> None:
    calls: dict[str, int] = {}
    for m in CALL.finditer(_disassembly()):
        if m.group(1) not in ALLOWED:
            calls[m.group(1)] = calls.get(m.group(1), 0) + 1
    assert not calls, f"intrinsics called out of line (name: count): {calls}"


# The exact mode's kernels (one row and batched tiles, both x86 builds).
EXACT_KERNELS = (
    "rlx_lm::quant::rows_avx2",
    "rlx_lm::quant::rows_avx512",
    "rlx_lm::quant::multirow::rows_avx2",
    "rlx_lm::quant::multirow::rows_avx512",
)
FUNCTION = re.compile(r"^[0-9a-f]+ <(.+)>:$")


def _per_function(text: str, mnemonic: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    name = ""
    for line in text.splitlines():
        m = FUNCTION.match(line)
        if m:
            name = m.group(1)
        elif f"\t{mnemonic} " in line:
            counts[name] = counts.get(name, 0) + 1
    return counts


def test_no_float16_scale_is_inserted_into_a_live_register() -> None:
    """A block's float16 scale built from its two bytes compiled to `vpinsrw`, which writes
    a quarter of a register and keeps the rest: LLVM picked registers the previous block had
    just written, so every block's scale waited on the block before. In the AVX-512 batched
    tiles' decoding that chain cost 0.6-0.9x (docs/kernels.md, eleventh session); the
    scales now come through whole-register writes (`whole_xmm`, `splat_half`)."""
    counts = _per_function(_disassembly(), "vpinsrw")
    found = {k: counts.get(k, 0) for k in EXACT_KERNELS}
    assert not any(found.values()), f"vpinsrw in the exact kernels: {found}"


def test_the_function_scan_counts_per_function() -> None:
    text = (
        "00000000000df5b0 <rlx_lm::quant::rows_avx2>:\n"
        "   dc88e:\tvpinsrw $0x0,(%rsi,%r10,1),%xmm0,%xmm10\n"
        "   dc88f:\tvpinsrw $0x0,(%rsi,%r10,1),%xmm0,%xmm10\n"
        "0000000000106450 <rlx_lm::other>:\n"
        "   dc890:\tvpinsrw $0x0,(%rsi,%r10,1),%xmm0,%xmm10\n"
        "   dc891:\tvmovd  %edi,%xmm0\n"
    )
    assert _per_function(text, "vpinsrw") == {"rlx_lm::quant::rows_avx2": 2, "rlx_lm::other": 1}


def test_the_pattern_finds_a_call_as_objdump_prints_it() -> None:
    line = "  14d8e7:\tcall   e9fc0 <core::core_arch::x86::avx512dq::_mm512_extractf32x8_ps>"
    m = CALL.search(line)
    assert m is not None
    assert m.group(1) == "core::core_arch::x86::avx512dq::_mm512_extractf32x8_ps"
