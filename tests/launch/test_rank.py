"""What runs inside every rank: patches that wait until the module they patch is imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.launch.helpers import launch, run_folder
from unidist.launch.rank.runtime import when_imported


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module nobody has imported yet, on sys.path."""
    (tmp_path / "late_module.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "late_module", raising=False)
    return "late_module"


def test_a_module_imported_later_is_patched_once_its_code_has_run(package: str) -> None:
    seen: list[int] = []

    def patch(module: ModuleType) -> None:
        seen.append(module.VALUE)
        module.VALUE = 2

    finders = len(sys.meta_path)
    when_imported(package, patch)
    assert seen == []  # nothing imported yet
    module = __import__(package)
    assert (seen, module.VALUE) == ([1], 2)  # after its code, before the importer got it
    assert len(sys.meta_path) == finders  # the hook left
    del sys.modules[package]
    assert __import__(package).VALUE == 1  # once only


def test_two_patches_of_one_module_both_apply_in_the_order_given(package: str) -> None:
    seen: list[str] = []
    finders = len(sys.meta_path)
    when_imported(package, lambda m: seen.append("first"))
    when_imported(package, lambda m: seen.append("second"))
    __import__(package)
    assert seen == ["first", "second"]
    assert len(sys.meta_path) == finders


def test_a_module_looked_up_before_it_is_imported_is_still_patched(package: str) -> None:
    import importlib.util

    when_imported(package, lambda m: setattr(m, "VALUE", 4))
    assert importlib.util.find_spec(package) is not None  # a look, no import
    assert package not in sys.modules
    assert __import__(package).VALUE == 4


def test_a_module_already_imported_is_patched_at_once(package: str) -> None:
    module = __import__(package)
    when_imported(package, lambda m: setattr(m, "VALUE", 3))
    assert module.VALUE == 3


def test_a_module_that_does_not_exist_still_fails_to_import(package: str) -> None:
    when_imported("no_such_module_anywhere", lambda m: None)
    with pytest.raises(ModuleNotFoundError):
        __import__("no_such_module_anywhere")


@pytest.mark.multiprocess
def test_a_rank_whose_script_does_not_import_torch_never_imports_it(tmp_path: Path) -> None:
    script = tmp_path / "no_torch.py"
    script.write_text("import sys\nprint('torch imported:', 'torch' in sys.modules)\n")
    done = launch("-n", "2", "--no-console", "--log-dir", str(tmp_path / "logs"), str(script))
    assert done.returncode == 0, done.stderr
    folder = run_folder(tmp_path / "logs")
    for rank in (0, 1):
        assert "torch imported: False" in (folder / f"rank{rank}.stdout.log").read_text()


def test_the_patches_apply_when_the_script_imports_torch() -> None:
    # A rank of one node's rank 0, as the launcher starts it: the store patch applies on every
    # torch; the destroy patch only where gloo's teardown can deadlock (torch < 2.8).
    code = (
        "import os, sys\n"
        "os.environ.update(RANK='0', WORLD_SIZE='2', LOCAL_WORLD_SIZE='2', LOCAL_RANK='0')\n"
        "from unidist.launch.rank.runtime import prepare_rank\n"
        "prepare_rank()\n"
        "assert 'torch' not in sys.modules\n"
        "import importlib, torch, torch.distributed as dist\n"
        "from unidist._base.workarounds import GLOO_TEARDOWN_DEADLOCK\n"
        "store = importlib.import_module('torch.distributed.rendezvous')._create_c10d_store\n"
        "print(store.__qualname__.split('.')[0], dist.destroy_process_group.__module__,\n"
        "      GLOO_TEARDOWN_DEADLOCK.present())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    store, destroy, deadlock = done.stdout.split()
    assert store == "_bind_stores"
    expected = (
        "unidist.launch.rank.runtime"
        if deadlock == "True"
        else "torch.distributed.distributed_c10d"
    )
    assert destroy == expected
