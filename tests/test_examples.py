"""Every example trains for real under ``unidist launch -n 2``: the loss falls, the ranks read
disjoint data that covers the dataset, and the custom adapter passes the conformance suite. The
DDP tutorial's example, turned back into plain torch by its ``# torch:`` comments, reads the same
samples and ends with the same weights, bit for bit, under torchrun and unidist launch."""

from __future__ import annotations

import ast
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

#: The examples run end to end on the torch users install, the newest (scripts/test runs the
#: tests marked so in the latest environment only; what they call is tested on every torch).
#: Composer's run in the pinned environment, the only one with Composer.
NEWEST = pytest.mark.newest_torch

#: example -> (marks, samples per epoch, whether every sample is read in an epoch)
EXAMPLES: dict[str, tuple[list[pytest.MarkDecorator], int, bool]] = {
    "train": ([NEWEST], 4096, True),
    "microbatch": ([NEWEST], 2048, True),
    "custom_adapter": ([NEWEST], 1024, True),
    "composer_trainer": ([pytest.mark.composer], 512, True),
    # drop_last=True, as in Ignite's cifar10: 1024 // 64 * 64 samples, each once.
    "ignite_cifar10": ([pytest.mark.ignite, NEWEST], 1024, True),
    "ddp_tutorial": ([NEWEST], 1024, True),
    "elastic": ([NEWEST], 480, True),
}

#: Arguments an example needs besides ``--record DIR`` ("{record}" is DIR).
EXTRA_ARGS = {
    "ddp_tutorial": ["--snapshot-path", "{record}/snapshot.pt"],
    "elastic": ["--checkpoint", "{record}/checkpoints"],
}


def test_every_example_is_tested_here() -> None:
    found = {path.stem for path in (ROOT / "examples").glob("*.py")}
    assert found == set(EXAMPLES)


UNIDIST_LAUNCH = ("-m", "unidist", "launch", "-n", "2")
TORCHRUN = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")


def _run(*args: str, torchs_exit_abort: bool = False) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` from the repository root with this checkout's unidist; it must succeed.

    ``torchs_exit_abort``: for the plain-torch yardstick (no unidist in it) under torchrun, a
    rank that died of SIGABRT at exit after its work, torch's own bug on the releases of
    GLOO_EXIT_ABORT ("terminate called without an active exception", pytorch#190489), counts
    as done: the records it wrote before are what the test compares. unidist's scripts must
    exit 0 under torchrun too (unidist drains gloo's workers at exit, see
    ``unidist.session.communicator.drain_gloo_at_exit``) and under ``unidist launch``.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0 and torchs_exit_abort and _torchs_exit_abort(done.stderr):
        print(f"torch's own abort at exit (GLOO_EXIT_ABORT) under {args[:2]}: tolerated")
        return done
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done


def _torchs_exit_abort(stderr: str) -> bool:
    from unidist._base.workarounds import GLOO_EXIT_ABORT

    return (
        GLOO_EXIT_ABORT.present()
        and "terminate called without an active exception" in stderr
        and "(exitcode: -6)" in stderr
        and "Traceback (most recent call last)" not in stderr.split("terminate called", 1)[0]
    )


def _launch(
    name: str, record: Path, launcher: tuple[str, ...] = UNIDIST_LAUNCH, script: Path | None = None
) -> list[dict[str, Any]]:
    """``script`` (default: the example itself) is the plain-torch yardstick, if given."""
    extra = [arg.format(record=record) for arg in EXTRA_ARGS.get(name, [])]
    command = (*launcher, str(script or f"examples/{name}.py"), *extra, "--record", str(record))
    _run(*command, torchs_exit_abort=script is not None and launcher == TORCHRUN)
    return [json.loads((record / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=marks)
        for name, (marks, _, _) in EXAMPLES.items()
        if name != "ddp_tutorial"  # its bit-for-bit test below runs it and checks the same
    ],
)
def test_example_trains_on_disjoint_data_under_unidist_launch(name: str, tmp_path: Path) -> None:
    assert_trained_on_disjoint_data(name, _launch(name, tmp_path))


def assert_trained_on_disjoint_data(name: str, ranks: list[dict[str, Any]]) -> None:
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


def plain_torch(source: str) -> str:
    """The script with each line below ``# torch: ...`` comments replaced by their statements."""
    lines: list[str] = []
    torch_spelling: list[str] = []
    for line in source.splitlines():
        code = line.lstrip()
        if code.startswith("# torch: "):
            torch_spelling.append(line[: len(line) - len(code)] + code.removeprefix("# torch: "))
        elif torch_spelling:  # the line torch spells otherwise
            lines.extend(torch_spelling)
            torch_spelling = []
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


@NEWEST
def test_the_ddp_tutorial_gives_plain_torchs_results_bit_for_bit(tmp_path: Path) -> None:
    twin = tmp_path / "plain_torch.py"
    twin.write_text(plain_torch((ROOT / "examples" / "ddp_tutorial.py").read_text()))
    tree = ast.parse(twin.read_text())
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert "unidist" not in names  # the twin is torch's alone
    assert "dist" in names
    runs = {
        "plain torch under torchrun": (TORCHRUN, twin),
        "unidist under torchrun": (TORCHRUN, None),
        "unidist under unidist launch": (UNIDIST_LAUNCH, None),
    }
    results = {}
    for label, (launcher, script) in runs.items():
        record = tmp_path / label.replace(" ", "_")
        record.mkdir()
        results[label] = _launch("ddp_tutorial", record, launcher, script)
        assert (record / "snapshot.pt").exists()
    assert_trained_on_disjoint_data("ddp_tutorial", results["unidist under unidist launch"])
    expected = results.pop("plain torch under torchrun")
    assert len(expected[0]["epochs"]) == 6  # the script's default
    assert expected[0]["epochs"][0] != expected[0]["epochs"][1]  # set_epoch reshuffled
    for label, ranks in results.items():
        for rank, (ours, theirs) in enumerate(zip(ranks, expected, strict=True)):
            for key in ("epochs", "losses", "weights"):
                assert ours[key] == theirs[key], f"{label}: rank {rank}'s {key} differ from torch's"


def _one_process(tmp_path: Path, label: str, *args: str) -> dict[str, Any]:
    record = tmp_path / label
    record.mkdir()
    done = _run("examples/ddp_tutorial.py", *args, "--record", str(record))
    result: dict[str, Any] = json.loads((record / "rank0.json").read_text())
    result["stdout"] = done.stdout
    return result


@NEWEST
def test_the_ddp_tutorial_resumes_from_its_snapshot_exactly(tmp_path: Path) -> None:
    # One process, no launcher: 4 epochs straight, or 2 and then 2 more from the snapshot.
    straight_snapshot = str(tmp_path / "straight.pt")
    straight = _one_process(tmp_path, "straight", "4", "2", "--snapshot-path", straight_snapshot)
    snapshot = str(tmp_path / "snapshot.pt")
    _one_process(tmp_path, "first", "2", "2", "--snapshot-path", snapshot)
    resumed = _one_process(tmp_path, "resumed", "4", "2", "--snapshot-path", snapshot)
    assert "resuming from epoch 2" in resumed["stdout"]
    assert resumed["epochs"] == straight["epochs"][2:]
    assert resumed["losses"] == straight["losses"][2:]
    assert resumed["weights"] == straight["weights"]


@NEWEST
def test_the_elastic_example_stopped_and_resumed_ends_with_the_same_weights(
    tmp_path: Path,
) -> None:
    # One process, stopped by SIGTERM mid-epoch (a scheduler's preemption), then run again: the
    # model, optimizer, learning-rate schedule and data position come back, and the final
    # weights are the uninterrupted run's, bit for bit (the same world size).
    import signal

    from tests._waiting import wait_for

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONWARNINGS": "ignore"}
    common = ["examples/elastic.py", "--epochs", "2", "--save-every", "1000", "--workers", "0"]
    straight = tmp_path / "straight.json"
    _run(*common, "--checkpoint", str(tmp_path / "a"), "--weights", str(straight))
    record = tmp_path / "record"
    record.mkdir()
    args = [*common, "--checkpoint", str(tmp_path / "b"), "--weights", str(tmp_path / "b.json")]
    first = subprocess.Popen(
        [sys.executable, *args, "--record", str(record), "--step-delay", "0.05"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def steps() -> int:
            return sum(len(p.read_text().splitlines()) for p in record.glob("reads-*.jsonl"))

        wait_for(lambda: steps() >= 25, 120, "25 steps of the first run")
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=120)
    finally:
        first.kill()
        first.communicate(timeout=30)
    assert first.returncode == -signal.SIGTERM, err[-3000:]
    saved = json.loads((tmp_path / "b" / "latest.json").read_text())["step"]
    assert 25 <= saved < 120  # mid-run: 2 epochs of 60 steps
    _run(*args)
    assert json.loads((tmp_path / "b.json").read_text()) == json.loads(straight.read_text())
