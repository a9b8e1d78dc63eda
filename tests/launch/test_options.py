"""``unidist launch`` option checks and --dry-run: refusals say what is wrong and how to fix it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from unidist.cli import main

JOB = str(Path(__file__).parents[1] / "scripts" / "job.py")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["launch", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nnodes", "2", "--node-rank", "0", JOB], "--nnodes 2 needs --master-addr"),
        (
            ["--nnodes", "2", "--node-rank", "2", "--master-addr", "h", JOB],
            "--node-rank 2 is not a node of --nnodes 2: node ranks are 0..1",
        ),
        (["--nnodes", "2", "--master-addr", "h", JOB], "--nnodes 2 needs --node-rank (0..1)"),
        (["--nproc", "0", JOB], "--nproc 0 starts no process"),
        (["--nproc", "two", JOB], "--nproc 'two' is not a number"),
        (["missing_script.py"], "script 'missing_script.py' does not exist"),
        (["-m", "no_such_module_xyz"], "no module named 'no_such_module_xyz'"),
        (["-n", "2", "--world-size", "5", JOB], "--world-size 5 is not a multiple of --nproc 2"),
        (
            ["-n", "2", "--world-size", "4", "--nnodes", "3", "--master-addr", "h", JOB],
            "means 2 node(s), but --nnodes is 3",
        ),
        (
            [
                "-n",
                "2",
                "--nnodes",
                "2",
                "--node-rank",
                "1",
                "--base-rank",
                "3",
                "--master-addr",
                "h",
                JOB,
            ],
            "--base-rank 3 cannot be honoured",
        ),
        (["--stdout", "out.log", JOB], "has no {rank} or {local_rank}"),
        (
            ["--stdout", "o{rank}.log", "--stderr", "o{rank}.log", JOB],
            "--stdout and --stderr both name",
        ),
        (["--stdout", "o{gpu}.log", JOB], "has an unknown placeholder"),
    ],
)
def test_refusals(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, _, err = run(capsys, *args)
    assert code == 2
    assert message in err, err


def test_a_busy_master_port_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = run(capsys, "--master-port", str(port), JOB)
    assert code == 2
    assert f"--master-port {port} is already in use" in err


def test_inside_another_launcher_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "TORCHELASTIC_RUN_ID": "x",
    }.items():
        monkeypatch.setenv(name, value)
    code, _, err = run(capsys, JOB)
    assert code == 2
    assert "running inside a job that torchrun already started" in err


def test_dry_run_shows_topology_and_equivalent_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "--dry-run",
        "-n",
        "4",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "node0",
        "--master-port",
        "29400",
        JOB,
        "--lr",
        "0.1",
    )
    assert code == 0
    assert "global ranks   4..7 on this node" in out
    assert (
        f"torchrun --nnodes 2 --node-rank 1 --nproc-per-node 4 --master-addr node0 "
        f"--master-port 29400 {JOB} --lr 0.1"
    ) in out
    assert (
        f"composer -n 4 --world_size 8 --node_rank 1 --master_addr node0 --master_port "
        f"29400 {JOB} --lr 0.1"
    ) in out
    assert 'idist.Parallel(backend="gloo", nproc_per_node=4, nnodes=2, node_rank=1' in out


def test_composer_spellings_and_world_size(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "--dry-run",
        "--nproc",
        "2",
        "--world_size",
        "4",
        "--node_rank",
        "1",
        "--master_addr",
        "h",
        "--base_rank",
        "2",
        JOB,
    )
    assert code == 0
    assert "nodes          2 (this is node 1)" in out


def test_slurm_step_gives_the_node_topology(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    slurm = {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_NNODES": "2",
        "SLURM_NODEID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_TASKS_PER_NODE": "1(x2)",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
    }
    for name, value in slurm.items():
        monkeypatch.setenv(name, value)
    code, out, _ = run(capsys, "--dry-run", "-n", "4", JOB)
    assert code == 0, out
    assert "nodes          2 (this is node 1)" in out
    assert "--master-addr gpu07 --master-port 19242" in out
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2")
    monkeypatch.setenv("SLURM_NNODES", "1")
    monkeypatch.setenv("SLURM_NODEID", "0")
    code, _, err = run(capsys, "--dry-run", JOB)
    assert code == 2
    assert "srun --ntasks-per-node=1 unidist launch" in err
