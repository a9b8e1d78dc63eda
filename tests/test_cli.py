"""The ``unidist`` command line: ``config`` in human and JSON form, help and errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from unidist.cli import main


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unidist", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def test_config_json_describes_a_torchrun_rank() -> None:
    env = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "TORCHELASTIC_RUN_ID": "x",
        "MASTER_ADDR": "h0",
        "MASTER_PORT": "1",
    }
    done = run_cli("config", "--json", env=env)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["launcher"] == "torchrun"
    assert info["topology"] == {
        "rank": 3,
        "world_size": 4,
        "local_rank": 1,
        "local_world_size": 2,
        "node_rank": 1,
        "num_nodes": 2,
        "launcher": "torchrun",
    }
    assert info["adapter"]["name"] == "torch"
    assert set(info["adapters"]) >= {"torch", "composer", "ignite", "serial"}
    assert "gloo" in info["backends"]
    assert info["initialized"] is False


def test_config_marks_backends_that_cannot_run_here() -> None:
    import torch

    from unidist.cli import diagnostics

    info = diagnostics.describe()
    text = diagnostics.format_config(info)
    [line] = [line for line in text.splitlines() if line.startswith("  backends")]
    if "nccl" in info["backends"] and not torch.cuda.is_available():  # a CUDA build, no GPU
        assert "nccl" in info["unusable_backends"]
        assert "nccl (built, unusable here)" in line
    else:  # a CPU build has no nccl; with a GPU it is usable
        assert "nccl" not in info["unusable_backends"]
        assert "nccl (" not in line
    assert "gloo" in line
    assert "gloo (" not in line


def test_config_reports_a_malformed_environment_without_crashing() -> None:
    done = run_cli("config", env={"RANK": "abc", "WORLD_SIZE": "2"})
    assert done.returncode == 0
    assert "topology      ERROR: RANK='abc' is not an integer" in done.stdout


def test_config_says_why_the_adapter_was_chosen() -> None:
    done = run_cli("config", env={"UNIDIST_ADAPTER": "ignite"})
    assert "adapter       ignite (UNIDIST_ADAPTER=ignite)" in done.stdout
    done = run_cli("config", env={"UNIDIST_ADAPTER": "nope"})
    assert "no adapter named 'nope'" in done.stdout


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "config" in capsys.readouterr().out


def test_version() -> None:
    done = run_cli("--version")
    assert done.stdout.startswith("unidist ")


# A daemon thread inside torch's store client (connect_within's: its connect cannot be
# interrupted) when the command returns. Finalization would end it with pthread_exit as it comes
# back (Python 3.13 and older; CPython gh-87135), and in a load run that aborted a launcher
# through torch's C++ frames (SIGABRT instead of its status). The command leaves without the
# teardown instead: the atexit handler, which a finalized interpreter runs, never writes its mark.
LINGERING = """
import atexit, sys, threading
from datetime import timedelta
from pathlib import Path
import torch.distributed as dist
import unidist.cli as cli

atexit.register(Path(sys.argv[2]).write_text, "finalized")

def connect():
    try:
        dist.TCPStore("127.0.0.1", int(sys.argv[1]), None, False, timedelta(seconds=60))
    except Exception:
        pass

def main():
    threading.Thread(target=connect, daemon=True).start()
    return 3

cli.main = main
cli.run()
"""


@pytest.mark.multiprocess
def test_the_command_leaves_with_its_status_while_a_thread_is_inside_torch(
    tmp_path: Path,
) -> None:
    import socket

    mark = tmp_path / "mark"
    with socket.socket() as refusing:  # bound, never listening: the connect retries, refused
        refusing.bind(("127.0.0.1", 0))
        port = str(refusing.getsockname()[1])
        done = subprocess.run(
            [sys.executable, "-c", LINGERING, port, str(mark)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 3, done.stderr[-3000:]
    assert not mark.exists(), "the interpreter was finalized with the thread inside torch"


def test_without_a_daemon_thread_the_command_exits_as_usual(tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    program = LINGERING.replace("threading.Thread(target=connect, daemon=True).start()", "pass")
    done = subprocess.run(
        [sys.executable, "-c", program, "1", str(mark)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stderr[-3000:]
    assert mark.read_text() == "finalized"
