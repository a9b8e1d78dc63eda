"""The layering in ``pyproject.toml`` holds, a wrong import breaks it, and nothing is cyclic.

``scripts/test`` runs ``lint-imports`` on the real tree; here a copy of the tree gets one
deliberately bad import, to show that the contracts catch it (imports inside functions included).
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grimp
import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import unidist

#: The same on every torch and framework: scripts/test runs these in the pinned environment only.
pytestmark = pytest.mark.repository

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path(unidist.__file__).resolve().parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
#: A function-level import, which a checker that skipped function bodies would miss.
LAZY_EDGE = ("unidist.session.lifecycle", "unidist.session.devices")


def _lint(tree: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the copy of unidist under ``tree/src``, with the project's contracts."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "NO_COLOR": "1"}
    selected = [arg for contract in contracts for arg in ("--contract", contract)]
    out = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(ROOT / "pyproject.toml"), *selected],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return subprocess.CompletedProcess(
        out.args, out.returncode, re.sub(r"\x1b\[[0-9;]*m", "", out.stdout), out.stderr
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the source tree to break."""
    shutil.copytree(SOURCE, tmp_path / "src" / "unidist", ignore=shutil.ignore_patterns("*.pyc"))
    return tmp_path


@pytest.mark.parametrize(
    ("module", "bad_import", "contract", "name"),
    [
        # An adapter reaching up into a neutral module, inside a function.
        (
            "adapters/torch.py",
            "from unidist import ranks",
            "adapters-contract-only",
            "Adapters hold the contract only",
        ),
        # The state slot calling lifecycle: the cycle this layout removed.
        (
            "session/state.py",
            "from unidist.session import lifecycle",
            "session",
            "session/: lifecycle on top",
        ),
        (
            "session/state.py",
            "from unidist.session import lifecycle",
            "acyclic",
            "No import cycles",
        ),
        # A lower floor reaching up to a higher one.
        ("session/state.py", "from unidist import ranks", "layers", "unidist is layered"),
        # A neutral module importing an integration instead of loading it by name.
        (
            "samplers.py",
            "from unidist.integrations import composer",
            "neutral",
            "Neutral modules never import",
        ),
        (
            "launch/plan/job.py",
            "from unidist.testing import requires",
            "testing",
            "Only unidist.testing",
        ),
        # The plan reaching into the launcher process, and the ranks' code into the plan's.
        (
            "launch/plan/job.py",
            "from unidist.launch.supervise import runner",
            "launch-rooms",
            "The launcher's rooms",
        ),
        (
            "launch/supervise/watch.py",
            "from unidist.launch.supervise import report",
            "launch-supervise",
            "The launcher process",
        ),
        # A feature talking to the control store itself instead of the session's communicator.
        (
            "microbatch.py",
            "from unidist.session import control",
            "communicator",
            "Above the session, only initialize starts the control store",
        ),
        # The plan asking torch itself instead of through launch.torchfacts.
        (
            "launch/plan/dryrun.py",
            "import torch.cuda",
            "plan-without-torch",
            "The plan imports no torch",
        ),
        # Plain data reaching up to the object built from it: the circle parallel/ had.
        (
            "parallel/strategies.py",
            "from unidist.parallel import config",
            "parallel-layers",
            "parallel/: the user's config on top",
        ),
    ],
)
def test_a_bad_import_breaks_its_contract(
    tree: Path, module: str, bad_import: str, contract: str, name: str
) -> None:
    kept = _lint(tree, contract)
    assert kept.returncode == 0, kept.stdout + kept.stderr  # the untouched copy passes
    target = tree / "src" / "unidist" / module
    target.write_text(
        target.read_text() + f"\n\ndef _breaks_the_layering() -> None:\n    {bad_import}\n"
    )
    broken = _lint(tree, contract)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert re.search(rf"{re.escape(name)}.* BROKEN", broken.stdout), broken.stdout
    assert "Contracts: 0 kept, 1 broken." in broken.stdout


def test_no_import_cycles_at_all() -> None:
    """Every module, package ``__init__`` included, with imports inside functions counted."""
    graph = grimp.build_graph("unidist", exclude_type_checking_imports=True, cache_dir=None)
    assert graph.direct_import_exists(importer=LAZY_EDGE[0], imported=LAZY_EDGE[1])
    closing = sorted(
        (importer, imported)
        for importer in graph.modules
        for imported in graph.find_modules_directly_imported_by(importer)
        if graph.chain_exists(importer=imported, imported=importer)
    )
    assert closing == [], f"these imports close a cycle: {closing}"


#: The top floor: modules written on the public API, as users write their scripts.
PUBLIC_API_USERS = (
    "cli/__init__.py",
    "cli/smoke.py",
    "__main__.py",
    "__init__.py",
    "compat/",
    "testing/",
)


def _public_name_imports(path: Path) -> list[str]:
    """``import unidist`` and ``from unidist import <a public name>`` in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(a.name == "unidist" for a in node.names):
            found.append(f"{path.relative_to(SOURCE)}:{node.lineno} import unidist")
        elif isinstance(node, ast.ImportFrom) and node.module == "unidist" and node.level == 0:
            for alias in node.names:
                submodule = SOURCE / alias.name
                if not (submodule.with_suffix(".py").exists() or submodule.is_dir()):
                    found.append(f"{path.relative_to(SOURCE)}:{node.lineno} {alias.name}")
    return found


def test_only_the_top_floor_imports_the_package_back() -> None:
    """The package's ``__init__`` sits above every layer and loads its names lazily (one
    table): a module below the top floor that imported it back would close a circle that
    lint-imports cannot see (the root package is no layer)."""
    found = [
        hit
        for path in sorted(SOURCE.rglob("*.py"))
        if not str(path.relative_to(SOURCE)).startswith(PUBLIC_API_USERS)
        for hit in _public_name_imports(path)
    ]
    assert found == [], "import the module that defines the name instead:\n" + "\n".join(found)


#: The modules that may import a unidist module by name: the two registries, and the package's
#: lazy exports and framework import (their names come from their own tables).
BY_NAME_ALLOWED = {
    "_base/frameworks.py",
    "adapters/registry.py",
    "__init__.py",
    "integrations/__init__.py",
}


def _imports_by_name(path: Path) -> list[str]:
    """Calls of ``import_module``/``__import__`` in ``path`` that can name a unidist module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name not in ("import_module", "__import__"):
            continue
        first = node.args[0]
        if isinstance(first, ast.JoinedStr):
            head = first.values[0] if first.values else None
            first = head if isinstance(head, ast.Constant) else first
        literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
        if not literal or str(first.value).startswith("unidist"):  # type: ignore[union-attr]
            found.append(f"{path.relative_to(SOURCE)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_nothing_imports_a_unidist_module_by_name_outside_the_registries() -> None:
    """An import by name hides an upward edge from lint-imports: only the registries may."""
    found = _scan(_imports_by_name, lambda name: name in BY_NAME_ALLOWED)
    assert found == [], "use unidist._base.frameworks.integration(...) instead:\n" + "\n".join(
        found
    )


def _scan(check: Callable[[Path], list[str]], allowed: Callable[[str], bool]) -> list[str]:
    """``check``'s hits in every module of the source tree but the ``allowed`` ones (by their
    path below ``unidist/``)."""
    return [
        hit
        for path in sorted(SOURCE.rglob("*.py"))
        if not allowed(str(path.relative_to(SOURCE)))
        for hit in check(path)
    ]


@contextlib.contextmanager
def _source(tree: Path) -> Iterator[None]:
    """Report paths below ``tree`` instead of the real source tree, for a check's own test."""
    global SOURCE
    saved, SOURCE = SOURCE, tree
    try:
        yield
    finally:
        SOURCE = saved


def test_the_check_sees_an_import_by_name(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import importlib\nfrom importlib import import_module\nw = 'ignite'\n"
        "importlib.import_module(f'unidist.integrations.{w}')\n"
        "import_module('unidist.integrations.composer')\n"
        "importlib.import_module(w)\nimportlib.import_module('torch.distributed')\n"
    )
    with _source(tmp_path):
        hits = _imports_by_name(bad)
    assert [hit.split()[0] for hit in hits] == ["bad.py:4", "bad.py:5", "bad.py:6"]


def test_the_framework_registry_matches_what_each_integration_provides() -> None:
    from unidist._base import frameworks as _frameworks

    for framework, (module, names) in _frameworks.INTEGRATIONS.items():
        tree = ast.parse((SOURCE / Path(*module.split(".")[1:])).with_suffix(".py").read_text())
        provides = next(
            node.value
            for node in tree.body
            if isinstance(node, ast.AnnAssign | ast.Assign)
            and "PROVIDES" in ast.unparse(node).split("=")[0]
        )
        declared = {elt.value for elt in ast.walk(provides) if isinstance(elt, ast.Constant)}
        assert declared == set(names), framework
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert set(names) <= defined, (framework, set(names) - defined)


def test_an_unknown_integration_function_says_what_there_is() -> None:
    from unidist._base import frameworks as _frameworks
    from unidist.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"no integration function 'fsdp'.*'ignite'"):
        _frameworks.integration("ignite", "fsdp")


def test_type_only_imports_go_down_too() -> None:
    """``if TYPE_CHECKING:`` imports are left out by lint-imports; the layers hold for them too."""
    graph = grimp.build_graph("unidist", exclude_type_checking_imports=False, cache_dir=None)
    layers = _layer_of()
    upward = sorted(
        (importer, imported)
        for importer in graph.modules
        for imported in graph.find_modules_directly_imported_by(importer)
        if (a := layers.get(_top(importer))) is not None
        and (b := layers.get(_top(imported))) is not None
        and b < a
    )
    assert upward == [], f"these imports point up a layer: {upward}"


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _layer_of() -> dict[str, int]:
    """Top-level name -> its layer's position in the contract (0: the top)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "layers")
    return {
        name.strip(): i
        for i, layer in enumerate(contract["layers"])
        for name in layer.replace(":", "|").split("|")
    }


#: The adapter's data movers; above the adapters only the communicator calls them.
PRIMITIVES = {"all_reduce", "all_gather", "broadcast", "barrier", "new_group"}
#: Who may call them on an adapter: the adapters themselves, the communicator, the
#: conformance kit (it tests an adapter's primitives one by one).
PRIMITIVE_CALLERS = {"session/communicator.py", "testing/conformance.py"}


def _adapter_primitive_calls(path: Path) -> list[str]:
    """Calls such as ``session.adapter.all_reduce(...)`` or ``adapter.barrier(...)``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value
        name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        if node.func.attr in PRIMITIVES and name in ("adapter", "_adapter"):
            found.append(f"{path.relative_to(SOURCE)}:{node.lineno} {ast.unparse(node.func)}")
    return found


def test_every_collective_reaches_the_adapter_through_the_communicator() -> None:
    """One road down: a collective, a barrier or a new group goes through ``session.comm``."""
    found = _scan(
        _adapter_primitive_calls,
        lambda name: name.startswith("adapters/") or name in PRIMITIVE_CALLERS,
    )
    assert found == [], "call session.comm.<primitive> instead:\n" + "\n".join(found)


def test_the_road_check_sees_a_direct_call(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("session.adapter.all_reduce(t, 'sum', None)\nsession.comm.barrier(1)\n")
    with _source(tmp_path):
        hits = _adapter_primitive_calls(bad)
    assert hits == ["bad.py:1 session.adapter.all_reduce"]
