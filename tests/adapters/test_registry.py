"""The adapter registry: lazy built-ins, install hints, entry points, registration, choice order."""

from __future__ import annotations

import sys
import textwrap
import types
from pathlib import Path

import pytest

from unidist.adapters import registry
from unidist.adapters.torch import TorchAdapter
from unidist.environments import variables as _env
from unidist.errors import AdapterNotFoundError, AdapterUnavailableError, ConfigurationError

NONE = _env.read({})


def test_builtins_are_listed_without_importing_frameworks() -> None:
    specs = registry.specs()
    assert {"torch", "composer", "ignite", "serial"} <= set(specs)
    assert specs["composer"].pip_hint == "pip install 'pytorch-unidist[composer]'"
    assert registry.available() == tuple(sorted(registry.available()))
    with pytest.raises(TypeError):
        specs["x"] = specs["torch"]  # type: ignore[index]  # read-only view


def test_unknown_adapter_lists_the_known_ones() -> None:
    with pytest.raises(AdapterNotFoundError, match="no adapter named 'horovod'; registered"):
        registry.get("horovod")


def test_missing_framework_names_the_pip_line() -> None:
    registry.register(
        "ghost",
        "ghost_pkg.adapter:Ghost",
        requires="ghost_pkg",
        pip_hint="pip install ghost-adapter",
    )
    with pytest.raises(AdapterUnavailableError) as caught:
        registry.get("ghost")
    assert caught.value.pip_hint == "pip install ghost-adapter"
    assert "needs the 'ghost_pkg' package, which is not installed" in str(caught.value)
    assert isinstance(caught.value, ImportError)
    assert "ghost" not in registry.available()


def test_registration_refuses_duplicates_unless_overridden() -> None:
    with pytest.raises(ConfigurationError, match="already registered"):
        registry.register("torch", TorchAdapter)
    registry.register("torch2", TorchAdapter)
    registry.register("torch2", TorchAdapter, override=True)
    assert isinstance(registry.get("torch2"), TorchAdapter)


def test_a_class_that_breaks_the_protocol_is_refused() -> None:
    registry.register("hollow", object)
    with pytest.raises(ConfigurationError, match="does not implement the adapter contract"):
        registry.get("hollow")


def test_entry_point_adapters_are_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "thirdparty_adapter.py").write_text(
        textwrap.dedent("""
        from unidist.adapters.torch import TorchAdapter
        class ThirdParty(TorchAdapter):
            name = "thirdparty"
            def detect(self, env):
                return "thirdparty says so" if env.launcher == "slurm" else None
    """)
    )
    info = tmp_path / "thirdparty_adapter-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: thirdparty-adapter\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[unidist.adapters]\nthirdparty = thirdparty_adapter:ThirdParty\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry._reset()
    spec = registry.specs()["thirdparty"]
    assert (spec.origin, spec.distribution) == ("entry point", "thirdparty-adapter")
    assert spec.version == "1.0"
    assert registry.get("thirdparty").name == "thirdparty"
    slurm = _env.read({"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"})
    adapter, reason = registry.choose(None, None, slurm)
    assert (adapter.name, reason) == ("thirdparty", "detected: thirdparty says so")


#: What Composer's launcher sets (NODE_RANK, no TORCHELASTIC_* variables).
COMPOSER_ENV = {
    "RANK": "0",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "0",
    "LOCAL_WORLD_SIZE": "2",
    "NODE_RANK": "0",
}


def test_choice_order() -> None:
    composer_env = _env.read(COMPOSER_ENV)
    assert registry.choose(None, None, NONE)[0].name == "torch"
    assert registry.choose(None, "serial", composer_env)[1] == "UNIDIST_ADAPTER=serial"
    assert registry.choose("torch", "serial", composer_env)[0].name == "torch"


@pytest.mark.composer
def test_composer_launcher_is_detected() -> None:
    composer_env = _env.read(COMPOSER_ENV)
    assert registry.choose(None, None, composer_env) == (
        registry.get("composer"),
        "detected: started by Composer's launcher (composer -n)",
    )


def test_a_live_ignite_context_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_utils = types.SimpleNamespace(_model=types.SimpleNamespace(name="native-dist"))
    monkeypatch.setitem(sys.modules, "ignite.distributed", types.ModuleType("ignite.distributed"))
    monkeypatch.setitem(sys.modules, "ignite.distributed.utils", fake_utils)  # type: ignore[arg-type]
    ignite_pkg = types.ModuleType("ignite")
    ignite_pkg.__path__ = []
    dist_pkg = sys.modules["ignite.distributed"]
    dist_pkg.utils = fake_utils  # type: ignore[attr-defined]
    ignite_pkg.distributed = dist_pkg  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ignite", ignite_pkg)
    adapter, reason = registry.choose(None, None, NONE)
    assert adapter.name == "ignite"
    assert "inside an Ignite context" in reason
