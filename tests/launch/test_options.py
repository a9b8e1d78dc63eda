"""``unidist launch`` option checks and --dry-run: refusals say what is wrong and how to fix it."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import socket
from pathlib import Path

import pytest

from tests.launch.helpers import JOB, free_port
from unidist.cli import main
from unidist.launch.options import REFUSED


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        code = main(["launch", *args])
    except SystemExit as exc:  # argparse's errors
        code = int(exc.code or 0)
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


# -- torchrun's options --------------------------------------------------------------------------


def _torchrun_options() -> list[tuple[str, argparse.Action]]:
    from torch.distributed.run import get_args_parser

    return [
        (option, action)
        for action in get_args_parser()._actions
        for option in action.option_strings
        if option not in ("-h", "--help")
    ]


def _value(option: str, action: argparse.Action, tmp_path: Path) -> list[str]:
    if action.nargs == 0:
        return []
    if action.choices:
        return [str(next(iter(action.choices)))]
    name = action.dest
    values = {
        "nnodes": "1",
        "nproc_per_node": "2",
        "rdzv_backend": "c10d",
        "rdzv_endpoint": f"localhost:{free_port()}",
        "rdzv_id": "job7",
        "rdzv_conf": "timeout=60",
        "max_restarts": "1",
        "monitor_interval": "0.5",
        "role": "trainer",
        "log_dir": str(tmp_path),
        "redirects": "3",
        "tee": "0:1",
        "local_ranks_filter": "0",
        "node_rank": "0",
        "master_addr": "127.0.0.1",
        "master_port": str(free_port()),
        "local_addr": "127.0.0.1",
        "event_log_handler": "null",
        "log_line_prefix_template": "[${rank}]",
        "signals_to_handle": "SIGTERM,SIGUSR1",
        "shutdown_timeout": "5",
    }
    return [values.get(name, "x")]


def _needs_newer_torch(option: str) -> bool:
    from torch.distributed.launcher.api import LaunchConfig

    fields = {f.name for f in dataclasses.fields(LaunchConfig)}
    needs = {
        "--signals-to-handle": "signals_to_handle",
        "--event-log-handler": "event_log_handler",
        "--numa-binding": "numa_options",
        "--virtual-local-rank": "virtual_local_rank",
    }
    name = needs.get(option.replace("_", "-"))
    return name is not None and name not in fields


@pytest.mark.parametrize(("option", "action"), _torchrun_options())
def test_every_torchrun_option_is_accepted_or_refused_with_the_equivalent(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, option: str, action: argparse.Action
) -> None:
    target = ["-m", "json.tool"] if action.dest == "module" else [JOB]
    given = [option, *_value(option, action, tmp_path)]
    if action.dest == "module":
        given = []
    code, out, err = run(capsys, "--dry-run", *given, *target)
    canonical = action.option_strings[-1 if action.option_strings[0] == "-r" else 0]
    canonical = canonical if canonical.startswith("--") else action.option_strings[1]
    if canonical.replace("_", "-") in REFUSED:
        assert code == 2, out
        assert "is torchrun's; unidist launch does not take it. HINT:" in err
    elif _needs_newer_torch(canonical):
        assert code == 2, out
        assert "needs a newer torch" in err
    else:
        assert code == 0, err
        assert "Equivalent commands:" in out
    assert "unrecognized arguments" not in err


def test_a_mistyped_option_gets_launchs_usage_and_a_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(capsys, "--nprocs", "2", JOB)
    assert code == 2
    assert err.startswith("usage: unidist launch ")
    assert "usage: unidist [-h]" not in err
    assert "unrecognized arguments: --nprocs" in err
    assert "(did you mean --nproc?)" in err
    code, _, err = run(capsys, "--dry-run", "--rdzv_backnd", "c10d", JOB)
    assert code == 2
    assert "(did you mean --rdzv_backend?)" in err


def test_nproc_per_node_auto_means_what_torchrun_means(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    _, out, _ = run(capsys, "--dry-run", "--nproc-per-node", "auto", JOB)
    torchrun_count = gpus or os.cpu_count()
    assert f"processes      {torchrun_count} on this node" in out
    _, out, _ = run(capsys, "--dry-run", "-n", "auto", JOB)  # unidist's: one per GPU, else 1
    assert f"processes      {max(gpus, 1)} on this node" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rdzv-conf", "last_cal_timeout=1"], "did you mean last_call_timeout?"),
        (["--rdzv-conf", "join_timeout"], "is not KEY=VALUE"),
        (["--rdzv-backend", "c10"], "did you mean c10d?"),
        (["--rdzv-backend", "etcd"], "pip install python-etcd"),
        (["--nnodes", "2", "--rdzv-backend", "c10d"], "needs --rdzv-endpoint HOST:PORT"),
        (["--nnodes", "1:2"], "is elastic, but the static rendezvous has a fixed number"),
        (["--nnodes", "2:1"], "is not a number of nodes or a MIN:MAX range"),
        (["--standalone", "--nnodes", "2"], "--standalone is a single-node job"),
        (
            ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:0"],
            "port 0 (a free port) only works on a single node",
        ),
        (["--console-ranks", "zero"], "--console-ranks 'zero' is not a list of ranks"),
        (["--redirects", "5"], "expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both)"),
        (["-n", "2", "--nproc-per-node", "2"], "both set the processes on this node"),
        (["--logs-specs", "mine"], "--log-dir DIR, or --stdout/--stderr templates"),
    ],
)
def test_rendezvous_and_console_refusals(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, _, err = run(capsys, "--dry-run", *args, JOB)
    assert code == 2
    assert message in err, err


def test_dry_run_of_a_c10d_job(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "--dry-run",
        "--nnodes",
        "1:4",
        "-n",
        "8",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "node0:29400",
        "--rdzv-id",
        "job7",
        "--rdzv-conf",
        "last_call_timeout=5",
        "--node-rank",
        "3",
        JOB,
    )
    assert code == 0
    assert "nodes          1:4 (this node's rank is assigned by the rendezvous)" in out
    assert "processes      8 on this node, 8 to 32 in all" in out
    assert "--node-rank 3 is ignored: the c10d rendezvous assigns node ranks" in out
    assert (
        "torchrun --nnodes 1:4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "
        f"node0:29400 --rdzv-id job7 --rdzv-conf last_call_timeout=5 {JOB}"
    ) in out
    assert "composer  (no equivalent" in out


def test_a_port_the_user_may_not_bind_is_not_called_in_use(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: socket.socket, address: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(socket.socket, "bind", refuse)  # what a non-root user gets for port 1
    code, _, err = run(capsys, "--master-port", "1", JOB)
    assert code == 2
    assert "--master-port 1: this user may not listen on port 1" in err
    assert "already in use" not in err


def test_a_folder_without_main_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(capsys, str(tmp_path))
    assert code == 2
    assert "is a folder without a __main__.py" in err


@pytest.mark.parametrize("option", ["--log-dir", "--stdout", "--stderr"])
def test_unwritable_log_places_fail_at_once_with_the_reason(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, option: str
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    value = str(blocker / "logs") if option == "--log-dir" else str(blocker / "x{rank}.log")
    code, _, err = run(capsys, "--log-dir", str(tmp_path / "ok"), option, value, JOB)
    assert code == 2
    assert str(blocker) in err
    assert f"'{blocker}' is a file, not a folder" in err
    assert "Traceback" not in err
    assert not list((tmp_path / "ok").glob("*")) if option != "--log-dir" else True
