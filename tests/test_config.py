"""The default thread count: the CPU affinity, capped by the cgroup's CPU quota.

Fake cgroup trees (v1 and v2 layouts, as Docker, Kubernetes and systemd write them) stand
in for ``/sys/fs/cgroup`` and ``/proc/self/cgroup``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlx_lm import LmRunnerBuilder
from rlx_lm import config as config_module
from rlx_lm.config import available_cores, cgroup_cpu_quota


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="ascii")


def _v1(cgroup: Path, quota: int, period: int = 100000) -> None:
    """A cgroup v1 ``cpu`` directory with its CFS quota and period."""
    _write(cgroup / "cpu.cfs_quota_us", f"{quota}\n")
    _write(cgroup / "cpu.cfs_period_us", f"{period}\n")


def _proc(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "proc_self_cgroup"
    p.write_text(text, encoding="ascii")
    return p


def test_v2_quota_is_the_smallest_along_the_path(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(root / "kubepods" / "pod1" / "c1" / "cpu.max", "250000 100000\n")
    _write(root / "kubepods" / "pod1" / "cpu.max", "150000 100000\n")
    _write(root / "kubepods" / "cpu.max", "max 100000\n")
    proc = _proc(tmp_path, "0::/kubepods/pod1/c1\n")
    assert cgroup_cpu_quota(root, proc) == pytest.approx(1.5)


def test_v2_without_a_quota(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(root / "user.slice" / "cpu.max", "max 100000\n")
    proc = _proc(tmp_path, "0::/user.slice\n")
    assert cgroup_cpu_quota(root, proc) is None


def test_v1_cpu_controller_quota(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _v1(root / "cpu,cpuacct" / "docker" / "abc", 200000)
    _v1(root / "cpu,cpuacct", -1)
    proc = _proc(tmp_path, "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n")
    assert cgroup_cpu_quota(root, proc) == pytest.approx(2.0)


def test_v1_unlimited_is_no_quota(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _v1(root / "cpu", -1)
    proc = _proc(tmp_path, "1:cpu:/\n")
    assert cgroup_cpu_quota(root, proc) is None


def test_a_host_path_outside_the_mount_finds_the_containers_own_cgroup(tmp_path: Path) -> None:
    # Without a cgroup namespace the container sees the host's path, but its cgroup is
    # mounted at the root of the hierarchy it can see.
    root = tmp_path / "cg"
    _v1(root / "cpu", 50000)
    proc = _proc(tmp_path, "1:cpu:/docker/0123456789abcdef\n")
    assert cgroup_cpu_quota(root, proc) == pytest.approx(0.5)


@pytest.mark.parametrize(
    "content", ["", "lots 100000", "100000", "100000 0", "-5 100000", "\xff\xfe"]
)
def test_malformed_cpu_max_counts_as_no_quota(tmp_path: Path, content: str) -> None:
    root = tmp_path / "cg"
    (root).mkdir()
    (root / "cpu.max").write_bytes(content.encode("latin-1"))
    assert cgroup_cpu_quota(root, _proc(tmp_path, "0::/\n")) is None


def test_no_cgroups_at_all(tmp_path: Path) -> None:
    assert cgroup_cpu_quota(tmp_path / "absent", tmp_path / "absent_proc") is None
    proc = _proc(tmp_path, "garbage without colons\n")
    assert cgroup_cpu_quota(tmp_path / "absent", proc) is None


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover
        return os.cpu_count() or 1


def test_available_cores_is_capped_by_the_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_module, "cgroup_cpu_quota", lambda: 1.5)
    assert available_cores() == 1  # rounded down, as Rust's available_parallelism does
    monkeypatch.setattr(config_module, "cgroup_cpu_quota", lambda: 0.2)
    assert available_cores() == 1  # never zero
    monkeypatch.setattr(config_module, "cgroup_cpu_quota", lambda: 4096.0)
    assert available_cores() == _affinity()  # the affinity when it is the smaller
    monkeypatch.setattr(config_module, "cgroup_cpu_quota", lambda: None)
    assert available_cores() == _affinity()


def test_the_builders_default_threads_follow_the_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_module, "cgroup_cpu_quota", lambda: 1.0)
    assert LmRunnerBuilder().threads() == 1
    assert LmRunnerBuilder().threads(3).threads() == 3  # an explicit count is kept
