"""The repository's own tooling: the pre-commit hooks run what the test command runs first."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _hook_entries() -> list[str]:
    text = (ROOT / ".pre-commit-config.yaml").read_text()
    return [m.strip() for m in re.findall(r"^\s+entry: (.+)$", text, flags=re.MULTILINE)]


def test_pre_commit_runs_the_checks_the_test_command_runs_first() -> None:
    script = (ROOT / "scripts" / "test").read_text()
    start = script.index("run_pinned() {")
    first = script[start : script.index("pytest", start)]
    checks = [
        line.strip().removesuffix("|| return 1").strip()
        for line in first.splitlines()
        if line.strip().startswith(".venv/bin/") and "mkdocs" not in line
    ]
    assert len(checks) == 4, checks  # ruff, ruff format, mypy, lint-imports
    assert set(checks) <= set(_hook_entries()), (checks, _hook_entries())


@pytest.mark.parametrize(
    ("message", "ok"),
    [
        ("Fix the sampler's epoch\n\nWhy it was wrong.\n", True),
        ("x" * 72 + "\n", True),
        ("x" * 73 + "\n", False),
        ("subject\nno blank line before the body\n", False),
        ("# only a comment\n", False),
    ],
)
def test_the_commit_message_hook(tmp_path: Path, message: str, ok: bool) -> None:
    assert "scripts/check-commit-msg" in _hook_entries()
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    done = subprocess.run(
        [str(ROOT / "scripts" / "check-commit-msg"), str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (done.returncode == 0) == ok, done.stderr
    if not ok:
        assert "check-commit-msg:" in done.stderr
