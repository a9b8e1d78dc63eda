"""The same script reports the same topology under every launcher, through every adapter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.launch.helpers import free_port

pytestmark = pytest.mark.multiprocess

SCRIPT = str(Path(__file__).parent / "scripts" / "report_topology.py")
BIN = Path(sys.executable).parent


def _free_slurm_job_id() -> str:
    """A job id whose derived port (15000 + id % 10000) is free now.

    Tried from a random start: two tests that ran srun at once (pytest workers, or the pinned and
    latest environments side by side) took the same first id, and so the same port.
    """
    import random
    import socket

    start = random.randrange(10000)
    for step in range(0, 10000, 97):
        job = (start + step) % 10000
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", 15000 + job))
            except OSError:
                continue
            return str(job)
    raise RuntimeError("no free port in 15000-24999")


def srun(adapter: str) -> subprocess.CompletedProcess[str]:
    """What `srun --ntasks=2 --nodes=1 python script.py` gives each task (no MASTER_* set)."""
    job = _free_slurm_job_id()
    base = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "SLURM_JOB_ID": job,
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_NNODES": "1",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_TASKS_PER_NODE": "2",
        "SLURM_NODEID": "0",
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_JOB_NAME": "train",
    }
    tasks = [
        subprocess.Popen(
            [sys.executable, SCRIPT, adapter],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
        )
        for r in range(2)
    ]
    outputs = [task.communicate(timeout=240) for task in tasks]
    code = max(abs(task.returncode) for task in tasks)
    return subprocess.CompletedProcess(
        [], code, outputs[0][0], "\n".join(err for _, err in outputs)
    )


def launch(kind: str, adapter: str) -> list[dict[str, object]]:
    commands = {
        "plain": [sys.executable, SCRIPT, adapter],
        "torchrun": [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            SCRIPT,
            adapter,
        ],
        "composer": [str(BIN / "composer"), "-n", "2", SCRIPT, adapter],
        "unidist": [sys.executable, "-m", "unidist", "launch", "-n", "2", SCRIPT, adapter],
        "ignite": [sys.executable, SCRIPT, adapter, "--ignite-parallel", str(free_port())],
    }
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if kind == "slurm":
        done = srun(adapter)
    else:
        done = subprocess.run(commands[kind], capture_output=True, text=True, env=env, timeout=240)
    # Composer's launcher picks a free port and lets it go before rank 0 binds it, and under
    # SLURM the port is derived from the job id (Ignite's rule, unidist's alike): on a busy
    # machine another process can take it in between (EADDRINUSE in rank 0). That race is the
    # launcher's, not the script's; retry it, and only it, twice.
    for _ in range(2):
        if (
            kind not in ("composer", "slurm")
            or done.returncode == 0
            or "EADDRINUSE" not in done.stdout + done.stderr
        ):
            break
        done = (
            srun(adapter)
            if kind == "slurm"
            else subprocess.run(
                commands[kind], capture_output=True, text=True, env=env, timeout=240
            )
        )
    # unidist launch prefixes each console line with "[rankN]: "
    lines = [
        line.split("TOPOLOGY ", 1)[1] for line in done.stdout.splitlines() if "TOPOLOGY " in line
    ]
    details = f"{kind}/{adapter} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, details
    assert len(lines) == 1, details
    return json.loads(lines[0])  # type: ignore[no-any-return]


TWO_RANKS = [
    {
        "rank": r,
        "world_size": 2,
        "local_rank": r,
        "local_world_size": 2,
        "node_rank": 0,
        "num_nodes": 1,
    }
    for r in range(2)
]
ONE_RANK = [
    {
        "rank": 0,
        "world_size": 1,
        "local_rank": 0,
        "local_world_size": 1,
        "node_rank": 0,
        "num_nodes": 1,
    }
]


COMPOSER = pytest.mark.composer
IGNITE = pytest.mark.ignite
ADAPTERS = [
    "torch",
    pytest.param("composer", marks=COMPOSER),
    pytest.param("ignite", marks=IGNITE),
]


LAUNCHERS = ["torchrun", "composer", "ignite", "slurm", "unidist"]
ADAPTER_NAMES = ["torch", "composer", "ignite"]
#: Each launcher once and each adapter once: what scripts/test runs on the newest torch (the
#: pinned one runs every pair, marked ``full_product`` here). Composer's cells all run there,
#: the only environment with Composer.
COVERING = {
    ("torchrun", "torch"),
    ("composer", "composer"),
    ("ignite", "ignite"),
    ("slurm", "torch"),
    ("unidist", "ignite"),
}


def _pair(launcher: str, adapter: str) -> Any:
    marks = [COMPOSER] if "composer" in (launcher, adapter) else []
    marks += [IGNITE] if "ignite" in (launcher, adapter) else []
    marks += [] if (launcher, adapter) in COVERING else [pytest.mark.full_product]
    return pytest.param(launcher, adapter, marks=marks, id=f"{launcher}-{adapter}")


@pytest.mark.parametrize(
    ("launcher", "adapter"),
    [_pair(launcher, adapter) for launcher in LAUNCHERS for adapter in ADAPTER_NAMES],
)
def test_two_process_launchers_agree(launcher: str, adapter: str) -> None:
    reports = launch(launcher, adapter)
    assert [{k: v for k, v in r.items() if k != "adapter"} for r in reports] == TWO_RANKS
    assert {r["adapter"] for r in reports} == {adapter}


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_plain_process_is_a_world_of_one(adapter: str) -> None:
    reports = launch("plain", adapter)
    assert [{k: v for k, v in r.items() if k != "adapter"} for r in reports] == ONE_RANK
