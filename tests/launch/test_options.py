"""``unidist launch`` option checks and --dry-run: refusals say what is wrong and how to fix it."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import inspect
import os
import resource
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.launch.helpers import JOB, free_port, launch, run_in_process
from unidist.launch.plan.options import REFUSED


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    return run_in_process(capsys, *args)


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
        "logs_specs": "default",  # torch's own torchrun.logs_specs entry point
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
    from torch.distributed.run import determine_local_world_size

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    _, out, _ = run(capsys, "--dry-run", "--nproc-per-node", "auto", JOB)
    assert f"processes      {determine_local_world_size('auto')} on this node" in out
    _, out, _ = run(capsys, "--dry-run", "-n", "auto", JOB)  # unidist's: one per GPU, else 1
    assert f"processes      {max(gpus, 1)} on this node" in out


def test_nproc_per_node_auto_counts_the_accelerator_as_this_torchs_torchrun_does(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three XPUs, no CUDA: torchrun of torch >= 2.8 asks torch.accelerator (3 processes);
    # torch 2.7's asks CUDA only (one per CPU core). unidist gives what the installed one does.
    import torch
    from torch.distributed.run import determine_local_world_size

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: 3)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: torch.device("xpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    expected = determine_local_world_size("auto")
    asks_the_accelerator = "torch.accelerator" in inspect.getsource(determine_local_world_size)
    assert expected == (3 if asks_the_accelerator else os.cpu_count())
    _, out, _ = run(capsys, "--dry-run", "--nproc-per-node", "auto", JOB)
    assert f"processes      {expected} on this node" in out


def test_nproc_per_node_names_torchrun_refuses_are_refused_with_torchruns_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(capsys, "--dry-run", "--nproc-per-node", "unknown", JOB)
    assert code == 2
    assert "--nproc-per-node 'unknown': Unsupported nproc_per_node value" in err


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
        (["--logs-specs", "mine"], "--logs-specs 'mine': no entry point of that name"),
        (["--duplicate-stdout-filters", "x"], "filter it there, e.g. grep PATTERN"),
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
        "node0:29400 --rdzv-id job7 --rdzv-conf "
        f"last_call_timeout=5,keep_alive_interval=2,keep_alive_max_attempt=3 {JOB}"
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


# -- every input checked before anything is created ---------------------------------------------


def _launch_bounded(
    args: list[str], cwd: Path, limits: dict[int, int] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``unidist launch ARGS`` in a new process with resource limits (soft values), bounded in
    memory (4 GiB of address space beyond the interpreter's) and time."""

    return launch(*args, cwd=cwd, timeout=timeout, limits=limits)


def test_a_huge_console_rank_range_is_refused_without_expanding_it(tmp_path: Path) -> None:
    # It was expanded into a set: 24 GB until the kernel killed the launcher. Bounded here to
    # 8 GiB of address space, so that a regression fails instead of taking the machine down.
    logs = tmp_path / "logs"
    done = _launch_bounded(
        ["-n", "2", "--log-dir", str(logs), "--console-ranks", "0-999999999999", JOB, "ok"],
        tmp_path,
        {resource.RLIMIT_AS: 8 << 30},
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--console-ranks '0-999999999999' names rank 999999999999" in done.stderr
    assert "has ranks 0..1" in done.stderr
    assert not logs.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--console-ranks", "2", "-n", "2"], "names rank 2, but the job (2 per node, one node)"),
        (["--console-ranks", "3-1"], "the range 3-1 goes backwards"),
        (["--local-ranks-filter", "0,4", "-n", "4"], "names rank 4, but a node (4 per node)"),
        (
            ["--timeout", "nan"],
            "--timeout must be a positive number of seconds and at most 31536000 (a year), "
            "got nan. HINT: e.g. --timeout 30.",
        ),
        (["--grace", "inf"], "--grace must be a positive number of seconds and at most 3153"),
        (["--shutdown-timeout", "nan"], "--shutdown-timeout must be a positive number of"),
        (["--exit-timeout", "inf"], "or 0 (waits for ever), got inf"),
        (["--exit-timeout", "-1"], "--exit-timeout must be a positive number of seconds"),
        (["--timeout", "1e400"], "(a year), got inf"),
        (["--timeout", "1e12"], "(a year), got 1000000000000.0"),
        (["--monitor-interval", "nan"], "--monitor-interval must be a number of seconds of"),
        (["--monitor-interval", "1e-300"], "of at least 0.001 and at most 31536000 (a year)"),
        (["--max-restarts", "-1"], "--max-restarts must be from 0 to 1000000, got -1."),
        (["--max-restarts", "10000000"], "from 0 to 1000000, got 10000000."),
        (["--world-size", "0"], "--world-size must be from 1 to 1048576, got 0."),
        (["--base-rank", "-1"], "--base-rank must be at least 0, got -1."),
        (["--master-port", "70000"], "--master-port must be from 0 to 65535, got 70000."),
        (
            ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "host\n:29400"],
            "--rdzv-endpoint 'host\\n:29400' contains a space or a control character",
        ),
        (
            ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29400\t"],
            "contains a space or a control character",
        ),
        (
            ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "[zz]:29400"],
            "brackets hold an IPv6 address, and 'zz' is not one",
        ),
        (
            ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "a:b:29400"],
            "an IPv6 address goes in brackets",
        ),
        (
            ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint=-bad-:29400"],
            "the host '-bad-' is not a host name",
        ),
        (
            ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:65536"],
            "the port '65536' is not a TCP port (0 to 65535)",
        ),
        (
            ["--nnodes", "2", "--node-rank", "1", "--master-addr", "node 0"],
            "--master-addr 'node 0' contains a space or a control character",
        ),
        (
            ["--nnodes", "2", "--node-rank", "1", "--master-addr", "300.1.2.3"],
            "--master-addr '300.1.2.3' is not a valid IPv4 address",
        ),
        (["--local-addr", "a..b"], "--local-addr 'a..b' is not a host name"),
        (["-n", "1000000000"], "unidist launch starts at most 4096 processes per node"),
        (
            [
                "-n",
                "1024",
                "--nnodes",
                "1:2000",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                "h:1",
            ],
            "-n 1024 on up to 2000 node(s) is 2048000 ranks; unidist launch takes at most 1048576",
        ),
    ],
)
def test_bad_values_are_refused_at_once(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = run(capsys, "--dry-run", *args, JOB)
    assert code == 2, out
    assert message in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "endpoint", ["node0:29400", "10.0.0.5:29400", "[fd00::5]:29400", "n_1.example.org."]
)
def test_good_endpoints_are_accepted(capsys: pytest.CaptureFixture[str], endpoint: str) -> None:
    args = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]
    code, _, err = run(capsys, "--dry-run", *args, JOB)
    assert code == 0, err


def test_a_bad_endpoint_is_refused_before_the_rendezvous_waits(tmp_path: Path) -> None:
    # torch's check of the host name lets a trailing newline through: 101 s of retries and 30
    # C++ frames before the message.
    started = time.monotonic()
    done = _launch_bounded(
        [
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "host\n:29400",
            "--log-dir",
            str(tmp_path / "logs"),
            JOB,
            "ok",
        ],
        tmp_path,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert time.monotonic() - started < 30
    assert "--rdzv-endpoint 'host\\n:29400' contains a space or a control character" in done.stderr
    assert not (tmp_path / "logs").exists()


def test_too_many_processes_for_the_open_file_limit(tmp_path: Path) -> None:
    # -n 99999 created 199,998 files and ended in an EMFILE traceback.
    logs = tmp_path / "logs"
    done = _launch_bounded(
        ["-n", "100", "--log-dir", str(logs), "missing.py"], tmp_path, {resource.RLIMIT_NOFILE: 256}
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "-n 100 needs about 464 open files in the launcher" in done.stderr
    assert "open-file limit (RLIMIT_NOFILE, `ulimit -n`) is 256; 48 rank(s) fit" in done.stderr
    assert "ulimit -n 464" in done.stderr or "the hard limit is" in done.stderr
    assert not logs.exists()


def test_too_many_processes_for_the_process_limits(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from unidist.launch.plan import checks

    real = resource.getrlimit
    monkeypatch.setattr(os, "getuid", lambda: 4242)  # root is not held to RLIMIT_NPROC
    monkeypatch.setattr(
        resource,
        "getrlimit",
        lambda which: (100, 100) if which == resource.RLIMIT_NPROC else real(which),
    )
    monkeypatch.setattr(checks, "_user_tasks", lambda: 90)
    code, _, err = run(capsys, "--dry-run", "-n", "20", JOB)
    assert code == 2
    assert "may run 100 processes and threads (RLIMIT_NPROC, `ulimit -u`) and already" in err
    assert "runs 90" in err
    monkeypatch.setattr(checks, "_user_tasks", lambda: 10)
    monkeypatch.setattr(checks, "_tasks_now", lambda: 32000)
    monkeypatch.setattr(checks, "_read_int", lambda path: 32010 if "pid_max" in path else 10**6)
    code, _, err = run(capsys, "--dry-run", "-n", "20", JOB)
    assert code == 2
    assert "the kernel allows only 32010 (kernel.pid_max, /proc/sys/kernel/pid_max)" in err
    assert "10 fit" in err


def test_a_log_place_blocked_by_a_folder_is_refused_before_anything_is_created(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "1.log").mkdir()  # where rank 1's stdout would go
    logs = tmp_path / "logs"
    stdout = str(tmp_path / "out" / "{rank}.log")
    code, _, err = run(capsys, "-n", "2", "--log-dir", str(logs), "--stdout", stdout, JOB, "ok")
    assert code == 2, err
    assert f"the log file '{tmp_path / 'out' / '1.log'}' is a folder, not a file" in err
    assert not logs.exists()
    assert not (tmp_path / "out" / "0.log").exists()
