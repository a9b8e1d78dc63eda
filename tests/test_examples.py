"""Every example trains for real under ``unidist launch -n 2``: the loss falls, the ranks read
disjoint data that covers the dataset, and the custom adapter passes the conformance suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from unidist.testing import check_adapter

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.multiprocess

#: example -> (marks, samples per epoch, whether every sample is read in an epoch)
EXAMPLES: dict[str, tuple[list[pytest.MarkDecorator], int, bool]] = {
    "train": ([], 4096, True),
    "microbatch": ([], 2048, True),
    "custom_adapter": ([], 1024, True),
    "composer_trainer": ([pytest.mark.composer], 512, True),
    # drop_last=True, as in Ignite's cifar10: 1024 // 64 * 64 samples, each once.
    "ignite_cifar10": ([pytest.mark.ignite], 1024, True),
}


def test_every_example_is_tested_here() -> None:
    found = {path.stem for path in (ROOT / "examples").glob("*.py")}
    assert found == set(EXAMPLES)


def _launch(name: str, record: Path) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, "-m", "unidist", "launch", "-n", "2"]
    done = subprocess.run(
        [*command, f"examples/{name}.py", "--record", str(record)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return [json.loads((record / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=marks) for name, (marks, _, _) in EXAMPLES.items()]
)
def test_example_trains_on_disjoint_data_under_unidist_launch(name: str, tmp_path: Path) -> None:
    ranks = _launch(name, tmp_path)
    _, samples, complete = EXAMPLES[name]
    first, second = (set(r["indices"]) for r in ranks)
    assert not first & second, f"ranks 0 and 1 both read {sorted(first & second)[:10]}"
    assert all(len(r["indices"]) == len(set(r["indices"])) for r in ranks)  # no repeats
    if complete:
        assert len(first | second) == samples
    for r in ranks:
        assert r["losses"] == ranks[0]["losses"]  # averaged over the ranks: the same everywhere
        assert r["losses"][-1] < r["losses"][0], r["losses"]
    if name == "microbatch":  # rank 1's simulated limit of 8 made every rank settle at 8
        assert [r["size"] for r in ranks] == [8, 8]
    if name == "custom_adapter":  # the training really went through the adapter
        assert ranks[0]["calls"]["all_reduce"] > 90


def test_the_custom_adapter_example_passes_check_adapter() -> None:
    report = check_adapter("examples.custom_adapter:CountingAdapter", world_size=2)
    assert report
    assert all(message is None for ranks in report.values() for message in ranks.values())
