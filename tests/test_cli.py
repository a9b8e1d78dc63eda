"""The ``unidist`` command line: ``config`` in human and JSON form, help and errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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

    from unidist import diagnostics

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
