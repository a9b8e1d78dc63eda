"""Every benchmark's quick mode runs to the end and prints its table, so none of them can rot.

The figures are not checked here (timed tests are flaky on shared machines); full runs stay
manual: ``python bench/<name>.py``. ``scripts/gpu-check --simulate`` runs here for the same
reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PEERS = [pytest.mark.composer, pytest.mark.ignite]  # benchmarks that measure the frameworks too

#: benchmark -> (marks, a line its table prints)
BENCHMARKS = {
    "collectives": ([], "unidist us"),
    "control_scale": ([], "new/old"),
    "gpu_microbatch": ([], "RESULT: PASS"),
    "harness": ([], "x run_distributed"),
    "import_time": (PEERS, "import unidist"),
    "launch": (PEERS, "failure -> exit s"),
    "microbatch": ([], "Retries until the size settles"),
    "resume": ([], "state.step() costs"),
    "samplers": (PEERS, "sampler (rank 0 of 8)"),
}

pytestmark = [pytest.mark.bench, pytest.mark.multiprocess]


def run(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_every_benchmark_is_listed_here() -> None:
    found = {path.stem for path in (ROOT / "bench").glob("*.py") if not path.stem.startswith("_")}
    assert found == set(BENCHMARKS)


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=marks) for name, (marks, _) in BENCHMARKS.items()]
)
def test_quick_mode_prints_its_table(name: str) -> None:
    done = run([sys.executable, f"bench/{name}.py", "--quick"], timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert BENCHMARKS[name][1] in done.stdout, done.stdout


def test_run_all_discovers_every_benchmark_and_writes_the_report(tmp_path: Path) -> None:
    report = tmp_path / "RESULTS.md"
    env_python = f"UNIDIST_PYTHON={sys.executable}"
    command = ["env", env_python, "bench/run_all", "--quick", "--only", "gpu_microbatch"]
    done = run([*command, "--output", str(report)], timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    text = report.read_text()
    for line in ("- date: ", "- machine: ", "- versions: unidist ", "torch "):
        assert line in text
    assert "| [gpu_microbatch](#gpu_microbatch) |" in text
    assert BENCHMARKS["gpu_microbatch"][1] in text  # the table itself, verbatim
    code = "import sys; sys.path.insert(0, 'bench'); import _run_all; print(_run_all.discover())"
    listed = run([sys.executable, "-c", code], 60)
    assert listed.stdout.strip() == str(sorted(BENCHMARKS)), listed.stderr


def test_gpu_check_simulate_passes() -> None:
    # UNIDIST_PYTHON: this interpreter, so the check runs in the environment under test.
    done = run(["env", f"UNIDIST_PYTHON={sys.executable}", "scripts/gpu-check", "--simulate"], 900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "== gpu-check summary ==" in done.stdout
    assert "gpu-check: every step passed" in done.stdout
