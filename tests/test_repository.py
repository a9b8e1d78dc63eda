"""The repository's own tooling: the pre-commit hooks run the checks the test command runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The same on every torch and framework: scripts/test runs these in the pinned environment only.
pytestmark = pytest.mark.repository


def _hook_entries() -> list[str]:
    text = (ROOT / ".pre-commit-config.yaml").read_text()
    return [m.strip() for m in re.findall(r"^\s+entry: (.+)$", text, flags=re.MULTILINE)]


def test_pre_commit_runs_the_checks_the_test_command_runs() -> None:
    script = (ROOT / "scripts" / "test").read_text()
    start = script.index("checks_pinned() {")
    first = script[start : script.index("\n}\n", start)]
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


SOURCE = ROOT / "src" / "unidist"
#: Top-level tests of the library as a whole, not of one module (each says what it covers).
WHOLE_LIBRARY = {
    "test_architecture": "the import layers (pyproject.toml, docs/architecture.md)",
    "test_bench": "every benchmark's quick mode (bench/)",
    "test_borrowed_ignite": "Ignite's idist behaviours under unidist's names",
    "test_borrowed_samplers": "torch's, Composer's and Ignite's samplers against unidist's",
    "test_borrowed_signatures": "the installed Composer and Ignite signatures against unidist's",
    "test_docs": "the docs' code blocks and references",
    "test_examples": "examples/ under the launchers",
    "test_gpu": "what needs a CUDA device",
    "test_import": "what `import unidist` imports",
    "test_launchers": "one script under every launcher",
    "test_public_api": "unidist's public names",
    "test_repository": "the repository's tooling and layout",
    "test_single_process": "the whole API in one process",
}


def _top_level_modules() -> set[str]:
    return {p.stem for p in SOURCE.glob("*.py")} | {
        p.name for p in SOURCE.iterdir() if (p / "__init__.py").exists()
    }


def test_tests_mirror_the_source_tree() -> None:
    """A module's tests are found by its path: tests/<package>/test_<module>.py."""
    wrong = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        folder = path.parent.relative_to(ROOT / "tests")
        if folder.parts and not (SOURCE / folder / "__init__.py").exists():
            wrong.append(f"{path.relative_to(ROOT)}: src/unidist/{folder} is not a package")
        if folder.parts or path.stem in WHOLE_LIBRARY:
            continue
        name = path.stem.removeprefix("test_")
        modules = {m.lstrip("_") for m in _top_level_modules()}  # _workarounds: test_workarounds
        owners = [m for m in modules if name == m or name.startswith(m + "_")]
        if not owners:
            wrong.append(
                f"{path.relative_to(ROOT)}: no src/unidist/{name}.py; a private module's tests "
                "go in its package's folder (tests/session/test_control.py), a whole-library "
                "test in WHOLE_LIBRARY"
            )
    assert wrong == [], "\n".join(wrong)


# -- the suite's own rules (tests/conftest.py), with pytest-xdist's workers as without them ----
# scripts/test runs the suite on several workers; the skips --allow-skips does not allow are
# tallied from the reports, which reach the controller, so a worker cannot hide one.

CONFTEST = Path(__file__).with_name("conftest.py")
TESTS = """
import pytest

@pytest.mark.otheruser
def test_needs_another_user():
    pass

def test_skips_itself():
    pytest.skip("no good reason")

@pytest.mark.xfail(strict=True)
def test_fails_as_expected():
    assert False

def test_passes():
    pass
"""


def _run(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # otheruser, not gpu: its need is checked without importing torch (2 s of CPU in each of
    # the nested run's processes).
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--allow-skips"]
    return subprocess.run(
        [*command, "otheruser", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("workers", ["0", "2"])
@pytest.mark.multiprocess
def test_a_skip_that_is_not_allowed_fails_the_run_with_or_without_workers(
    tmp_path: Path, workers: str
) -> None:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_some.py").write_text(TESTS)
    failed = _run(tmp_path, "-n", workers)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "skips that --allow-skips does not allow" in failed.stdout
    assert "test_some.py::test_skips_itself: no good reason" in failed.stdout
    assert "test_needs_another_user:" not in failed.stdout  # a marker's skip is allowed (or it ran)
    assert "test_fails_as_expected:" not in failed.stdout  # an xfail is not a skip
    passed = _run(tmp_path, "-n", workers, "-k", "not skips_itself")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "does not allow" not in passed.stdout


def test_a_failed_install_leaves_no_stamp_so_the_next_run_installs_again(tmp_path: Path) -> None:
    # scripts/test calls ensure_venv in a `|| return 1` (errexit is off in there): a pip that
    # failed once wrote the stamp anyway, and every later run skipped the install.
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    flaky = tmp_path / "fail-once"
    flaky.touch()
    # A stand-in for the environment's python: the first `pip install ARGS` fails, then not.
    python.write_text(
        f'#!/bin/sh\n[ "$5" = "some-package" ] && [ -e {flaky} ] && rm {flaky} && exit 1\nexit 0\n'
    )
    python.chmod(0o755)
    script = (
        f"source {ROOT / 'scripts' / '_venv.sh'}; set +e; "
        f"ensure_venv {venv} probe some-package || echo 'install failed'; "
        f"ensure_venv {venv} probe some-package && echo 'install ok'"
    )
    env = {**os.environ, "UNIDIST_INSTALLER": "pip"}  # the stand-in answers pip's command line
    done = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env
    )
    assert "install failed" in done.stdout, done.stdout + done.stderr
    assert "install ok" in done.stdout, done.stdout + done.stderr
    assert done.stdout.count("pip install") == 2, done.stdout  # the second run installed again
    assert (venv / ".unidist-stamp").exists()  # written by the install that succeeded


def _installer_given(tmp_path: Path, pip_config: str) -> str:
    """What scripts/_venv.sh chooses, and tells uv, where ``pip config list`` prints this."""
    bin_dir = tmp_path / ".venv-uv" / "bin"
    bin_dir.mkdir(parents=True)
    (tmp_path / ".venv-uv" / ".unidist-stamp").write_text(
        re.search(r"^uv==\S+", (ROOT / "constraints-tools.txt").read_text(), re.M)[0] + "\n"
    )
    (tmp_path / "constraints-tools.txt").write_text((ROOT / "constraints-tools.txt").read_text())
    python = bin_dir / "python"  # a stand-in: only `python -m pip config list` is asked of it
    python.write_text(f"#!/bin/sh\ncat <<'EOF'\n{pip_config}EOF\n")
    python.chmod(0o755)
    script = (
        f'source {ROOT / "scripts" / "_venv.sh"}; choose_installer; echo "installer=$_installer"; '
        '[ $_installer = pip ] || printf \'%s\\n\' "${_uv_args[@]}" "${_uv_env[@]}"'
    )
    env = {k: v for k, v in os.environ.items() if k != "UNIDIST_INSTALLER"}
    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_uv_is_told_pips_indexes_constraints_and_certificate(tmp_path: Path) -> None:
    said = _installer_given(
        tmp_path,
        "global.extra-index-url='file:///a/simple file:///b/simple'\n"
        "global.constraint='/etc/caps.txt'\n"
        ":env:.find-links='/opt/wheels'\n"
        "global.cert='/etc/ca.crt'\n"
        ":env:.default-timeout='180'\n"
        ":env:.disable-pip-version-check='1'\n",
    )
    assert said.splitlines() == [
        "installer=uv",
        "--index-strategy",
        "unsafe-best-match",  # pip's rule: the best version on any index
        "--compile-bytecode",  # as pip does
        "--extra-index-url",
        "file:///a/simple",
        "--extra-index-url",
        "file:///b/simple",
        "--constraint",
        "/etc/caps.txt",
        "--find-links",
        "/opt/wheels",
        "SSL_CERT_FILE=/etc/ca.crt",
        "UV_HTTP_TIMEOUT=180",
    ]


def test_a_pip_setting_uv_is_not_told_of_leaves_the_installing_to_pip(tmp_path: Path) -> None:
    said = _installer_given(
        tmp_path, "global.index-url='https://mirror/simple'\nglobal.proxy='http://p:3128'\n"
    )
    assert "[setup] pip installs: pip's setting global.proxy='http://p:3128' has no uv" in said
    assert said.splitlines()[-1] == "installer=pip"
