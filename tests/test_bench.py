"""Every benchmark's quick mode runs to the end and prints its table, so none of them can rot.

The figures are not checked here (timed tests are flaky on shared machines); full runs stay
manual: ``python bench/<name>.py``. ``scripts/gpu-check --simulate`` runs here for the same
reason.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PEERS = [pytest.mark.composer, pytest.mark.ignite]  # benchmarks that measure the frameworks too

#: benchmark -> (marks, a line its table prints)
BENCHMARKS = {
    "checkpoints": (PEERS, "stall x dcp.save"),
    "collectives": ([], "unidist us"),
    "control_scale": ([], "new/old"),
    "gpu_microbatch": ([], "RESULT: PASS"),
    "hang": ([], "s to exit"),
    "harness": ([], "x run_distributed"),
    "import_time": (PEERS, "import unidist"),
    "launch": (PEERS, "failure -> exit s"),
    "microbatch": ([], "Retries until the size settles"),
    "recovery": ([], "from the kill to"),
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


#: The benchmark the run_all test below runs (its --quick mode, its table checked there too).
BY_RUN_ALL = "gpu_microbatch"


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=marks)
        for name, (marks, _) in BENCHMARKS.items()
        if name != BY_RUN_ALL  # the same command again, seconds of CPU for nothing new
    ],
)
def test_quick_mode_prints_its_table(name: str) -> None:
    done = run([sys.executable, f"bench/{name}.py", "--quick"], timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert BENCHMARKS[name][1] in done.stdout, done.stdout


def test_run_all_discovers_every_benchmark_and_writes_the_report(tmp_path: Path) -> None:
    report = tmp_path / "RESULTS.md"
    env_python = f"UNIDIST_PYTHON={sys.executable}"
    command = ["env", env_python, "bench/run_all", "--quick", "--only", BY_RUN_ALL]
    done = run([*command, "--output", str(report)], timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    text = report.read_text()
    for line in ("- date: ", "- machine: ", "- versions: unidist ", "torch "):
        assert line in text
    assert f"| [{BY_RUN_ALL}](#{BY_RUN_ALL}) |" in text
    assert BENCHMARKS[BY_RUN_ALL][1] in text  # the table itself, verbatim
    code = "import sys; sys.path.insert(0, 'bench'); import _run_all; print(_run_all.discover())"
    listed = run([sys.executable, "-c", code], 60)
    assert listed.stdout.strip() == str(sorted(BENCHMARKS)), listed.stderr


def test_gpu_check_simulate_passes() -> None:
    # UNIDIST_PYTHON: this interpreter, so the check runs in the environment under test.
    done = run(["env", f"UNIDIST_PYTHON={sys.executable}", "scripts/gpu-check", "--simulate"], 900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "== gpu-check summary ==" in done.stdout
    assert "gpu-check: every step passed" in done.stdout


def test_a_launcher_that_hung_in_every_run_keeps_its_row_in_the_launch_tables(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Ignite's Parallel can hang on torch 2.7 (gloo's destructor, pytorch PR #154976): its row
    # once vanished from the table instead of showing the hang. No launcher runs here.
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # undone after: the bench's own insert too
    spec = importlib.util.spec_from_file_location("bench_launch", ROOT / "bench" / "launch.py")
    assert spec is not None
    assert spec.loader is not None
    launch = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(launch)
    finally:
        sys.modules.pop("_util", None)  # the bench's helper module, imported by that name

    def once(command: list[str], fail: str | None) -> tuple[float | None, int, float | None]:
        if "--ignite-parallel" in command or (fail and "torch.distributed.run" in command):
            return None, -1, None  # hung
        return 2.0, (1 if fail else 0), (0.5 if fail else None)

    monkeypatch.setattr(launch, "once", once)
    monkeypatch.setattr(launch, "dataloader_rows", lambda repeat, quick: [("here", 0.1, 1.0)])
    monkeypatch.setattr(sys, "argv", ["launch.py", "--repeat", "1"])  # every launcher's rows
    launch.main()
    out = capsys.readouterr().out
    assert re.search(r"ignite Parallel\s+-\s+-\s+2/2\n", out), out  # the job and the failure
    assert re.search(r"torchrun\s+-\s+-\s+hung\n", out), out  # its failure run hung
    assert re.search(r"unidist launch\s+0\.5\s+nan\s+\[1\]\n", out), out
