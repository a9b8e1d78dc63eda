"""The layering in ``pyproject.toml`` holds, a wrong import breaks it, and nothing is cyclic.

``scripts/test`` runs ``lint-imports`` on the real tree; here a copy of the tree gets one
deliberately bad import, to show that the contracts catch it (imports inside functions included).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

import unidist

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path(unidist.__file__).resolve().parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
#: A function-level import, which a checker that skipped function bodies would miss.
LAZY_EDGE = ("unidist.lifecycle", "unidist.devices")


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
        ("_state.py", "from unidist import lifecycle", "layers", "unidist is layered"),
        ("_state.py", "from unidist import lifecycle", "acyclic", "No import cycles"),
        # A neutral module importing an integration instead of loading it by name.
        (
            "samplers.py",
            "from unidist.integrations import composer",
            "neutral",
            "Neutral modules never import",
        ),
        (
            "launch/plan.py",
            "from unidist.testing import requires",
            "testing",
            "Only unidist.testing",
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
