"""The family registry: registration, lookup, lazy built-ins and entry points."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest
from third_party import needs_toy

import rlx_lm
from rlx_lm import (
    InvalidOptionError,
    ModelRegistration,
    UnknownArchitectureError,
    auto_runner_name,
    match_architectures,
    register_model,
    registered_models,
)
from rlx_lm import registry as reg_module


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> reg_module._Registry:
    """A fresh registry with no built-ins and an entry-point group nobody uses."""
    fresh = reg_module._Registry(builtins=(), group="rlx_lm.tests.no_such_group")
    monkeypatch.setattr(reg_module, "_registry", fresh)
    return fresh


def test_register_directly_and_look_up_case_insensitively(registry: object) -> None:
    seen: list[tuple[str, Path]] = []

    def matches(arch: str, path: Path) -> bool:
        seen.append((arch, path))
        return arch == "llama"

    llama = register_model(ModelRegistration("llama", "Llama family", matches))
    assert registered_models() == (llama,)
    assert auto_runner_name("LLaMA", "m.gguf") == "llama"
    assert seen == [("llama", Path("m.gguf"))]


def test_register_as_a_decorator_keeps_the_loader(registry: object) -> None:
    @register_model("toy", "a toy", matches=match_architectures("Toy", "toy2"))
    def load_toy(builder: rlx_lm.LmRunnerBuilder) -> object:
        return builder

    assert callable(load_toy)
    (only,) = registered_models()
    assert (only.family, only.description, only.load) == ("toy", "a toy", load_toy)
    assert auto_runner_name("TOY2", "/x") == "toy"


def test_first_match_wins_in_registration_order(registry: object) -> None:
    register_model(ModelRegistration("a", "", lambda arch, path: arch.startswith("l")))
    register_model(ModelRegistration("b", "", lambda arch, path: True))
    assert auto_runner_name("llama", "m") == "a"
    assert auto_runner_name("qwen3", "m") == "b"


def test_the_path_can_decide(registry: object) -> None:
    register_model(ModelRegistration("mlx-dir", "", lambda arch, path: path.suffix == ""))
    assert auto_runner_name("", "models/dir") == "mlx-dir"
    with pytest.raises(UnknownArchitectureError):
        auto_runner_name("", "model.gguf")


def test_no_match_names_the_architecture_and_the_families(registry: object) -> None:
    register_model(ModelRegistration("llama", "", match_architectures("llama")))
    register_model(ModelRegistration("qwen3", "", match_architectures("qwen3")))
    with pytest.raises(UnknownArchitectureError) as info:
        auto_runner_name("Gemma3", "/models/g.gguf")
    message = str(info.value)
    assert "'gemma3'" in message
    assert "registered families: llama, qwen3" in message
    assert "/models/g.gguf" in message
    assert isinstance(info.value, ValueError)


def test_no_families_at_all_says_so(registry: object) -> None:
    with pytest.raises(UnknownArchitectureError, match="registered families: none"):
        auto_runner_name("llama", "m.gguf")


def test_a_family_registers_once_unless_replaced(registry: object) -> None:
    first = ModelRegistration("llama", "first", match_architectures("llama"))
    register_model(first)
    register_model(first)  # the same registration again is harmless
    with pytest.raises(InvalidOptionError, match="already registered"):
        register_model(ModelRegistration("llama", "second", match_architectures("llama")))
    second = ModelRegistration("llama", "second", match_architectures("x"))
    register_model(second, replace=True)
    assert registered_models() == (second,)


def test_invalid_registrations_are_refused() -> None:
    with pytest.raises(InvalidOptionError, match="family"):
        ModelRegistration("", "", match_architectures("x"))
    with pytest.raises(InvalidOptionError, match="matches"):
        ModelRegistration("x", "", "llama")  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="load"):
        ModelRegistration("x", "", match_architectures("x"), load=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="matches="):
        register_model("x")  # type: ignore[call-overload]


def test_a_broken_matcher_is_skipped_and_reported(registry: object) -> None:
    def broken(arch: str, path: Path) -> bool:
        raise KeyError("oops")

    register_model(ModelRegistration("broken", "", broken))
    register_model(ModelRegistration("ok", "", match_architectures("llama")))
    assert auto_runner_name("llama", "m") == "ok"
    with pytest.raises(UnknownArchitectureError, match=r"broken\.matches raised KeyError"):
        auto_runner_name("qwen", "m")


def test_builtins_are_imported_lazily_on_first_lookup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "rlx_lm_test_builtin_runner"
    (tmp_path / f"{name}.py").write_text(
        "from rlx_lm import ModelRegistration, match_architectures, register_model\n"
        "register_model(ModelRegistration('builtin', '', match_architectures('b')))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    fresh = reg_module._Registry(builtins=(name,), group="rlx_lm.tests.none")
    monkeypatch.setattr(reg_module, "_registry", fresh)
    assert name not in sys.modules
    assert auto_runner_name("B", "m") == "builtin"
    assert name in sys.modules
    assert [r.family for r in registered_models()] == ["builtin"]


def _fake_entry_points(
    monkeypatch: pytest.MonkeyPatch, *eps: importlib.metadata.EntryPoint
) -> None:
    def fake(group: str) -> tuple[importlib.metadata.EntryPoint, ...]:
        return tuple(ep for ep in eps if ep.group == group)

    monkeypatch.setattr(reg_module, "entry_points", fake)


def test_broken_entry_points_are_skipped_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    group = "rlx_lm.tests.plugins"
    here = sys.modules[__name__]
    here.GOOD = ModelRegistration("good", "", match_architectures("good"))  # type: ignore[attr-defined]
    here.NOT_A_REGISTRATION = 42  # type: ignore[attr-defined]
    _fake_entry_points(
        monkeypatch,
        importlib.metadata.EntryPoint("missing", "rlx_lm_no_such_module:X", group),
        importlib.metadata.EntryPoint("wrong", f"{__name__}:NOT_A_REGISTRATION", group),
        importlib.metadata.EntryPoint("good", f"{__name__}:GOOD", group),
        importlib.metadata.EntryPoint("module", "json", group),
    )
    monkeypatch.setattr(reg_module, "_registry", reg_module._Registry(builtins=(), group=group))
    with pytest.warns(RuntimeWarning, match="skipped entry point") as warned:
        assert auto_runner_name("GOOD", "m") == "good"
    assert len(warned) == 2
    with pytest.raises(UnknownArchitectureError) as info:
        auto_runner_name("other", "m")
    assert "'missing'" in str(info.value)
    assert "ModuleNotFoundError" in str(info.value)
    assert "names a int" in str(info.value)


@needs_toy
def test_the_installed_third_party_family_is_found_through_its_entry_point() -> None:
    families = {r.family: r for r in registered_models()}
    assert "rlxtoy" in families
    assert families["rlxtoy"].description.startswith("bigram toy runner")
    assert auto_runner_name("RLXTOY", "whatever.gguf") == "rlxtoy"
