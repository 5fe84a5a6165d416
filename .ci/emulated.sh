#!/usr/bin/env bash
# Run a wheel where this machine cannot run it natively, under qemu-user.
#
#   bash .ci/emulated.sh aarch64 WHEEL NATIVE_VENV
#       Debian 12's own aarch64 CPython 3.11 (its arm64 .debs, unpacked into a root
#       folder: no chroot, no second dpkg database), the wheel and its declared
#       dependencies for aarch64 in a --target folder; then the smoke (bundled model,
#       greedy and seeded tokens, which must equal the native x86_64 run's) and the
#       core Rust-backed test files.
#   bash .ci/emulated.sh x86_64-noavx WHEEL NATIVE_VENV
#       The installed x86_64 wheel on an emulated CPU without AVX/AVX2/FMA (Nehalem):
#       the portable kernels, chosen at run time, must load and give the same tokens.
#
# Needs qemu-user-static (apt) and uv on PATH; arm64 must be a dpkg foreign architecture
# with its package lists fetched (.ci/run does both).
set -euo pipefail
mode=$1 wheel=$2 native=$3
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

expected=$("$native/bin/python" "$here/smoke.py")
echo "native x86_64: $expected" >&2

case "$mode" in
aarch64)
    root=$work/root site=$work/site
    mkdir -p "$root" "$work/debs"
    chmod 777 "$work/debs"  # apt-get download fetches as the _apt user
    pkgs=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
        --no-breaks --no-replaces --no-enhances --no-pre-depends \
        python3.11-minimal:arm64 libpython3.11-stdlib:arm64 libstdc++6:arm64 \
        | grep -E '^[a-z0-9][^ ]*:arm64$' | sort -u)
    (cd "$work/debs" && apt-get download -q $pkgs >/dev/null)
    for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$root"; done
    py=(qemu-aarch64-static -L "$root" "$root/usr/bin/python3.11")
    "${py[@]}" -c 'import platform, sys; print("emulated:", platform.machine(), sys.version)' >&2
    uv pip install -q --python-platform aarch64-manylinux_2_36 --python-version 3.11 \
        --target "$site" "$wheel[testing]" 'safetensors>=0.4'
    got=$(PYTHONPATH=$site "${py[@]}" "$here/smoke.py")
    echo "emulated aarch64: $got" >&2
    [ "$got" = "${expected/x86_64/aarch64}" ] || { echo "aarch64 tokens differ from x86_64" >&2; exit 1; }
    # The Rust-backed core under emulation (about 10x slower than native: a fixed subset,
    # hypothesis's "ci-fast" profile). Run from outside the source tree, against the wheel.
    cd "$work"
    HYPOTHESIS_PROFILE=ci-fast PYTHONPATH=$site "${py[@]}" -m pytest -q -p no:cacheprovider \
        "$here/../tests/test_argmax.py" "$here/../tests/test_sampling_chain.py" \
        "$here/../tests/test_kv_cache.py" "$here/../tests/test_quant.py"
    ;;
x86_64-noavx)
    got=$(qemu-x86_64-static -cpu Nehalem "$native/bin/python" "$here/smoke.py")
    echo "emulated x86_64 without AVX: $got" >&2
    [ "$got" = "$expected" ] || { echo "portable kernels' tokens differ from AVX2's" >&2; exit 1; }
    ;;
*)
    echo "unknown mode $mode" >&2
    exit 2
    ;;
esac
