"""Two rank processes started by hand, placed only by the variables a test gives them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from unidist.environments import variables as _env

#: What would place the ranks before the environment under test could.
OTHER_PLACES = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "UNIDIST_LAUNCHER",
        "UNIDIST_PROGRESS",
        "TORCHELASTIC_RUN_ID",
        "SLURM_PROCID",
        "SLURM_STEP_ID",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "PMI_RANK",
        "PMI_SIZE",
    }
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_two_ranks(
    job: str,
    variables: Callable[[int, int], dict[str, str]],
    pythonpath: Sequence[Path],
    cwd: Path | None = None,
) -> tuple[list[int], list[tuple[str, str]]]:
    """``python -c job`` as ranks 0 and 1, with ``variables(rank, port)`` and nothing of
    :data:`OTHER_PLACES`; a port another program took in between is chosen again (3 tries).

    Returns:
        Each rank's exit code and its (stdout, stderr).
    """
    base = {k: v for k, v in _env.environ_copy().items() if k not in OTHER_PLACES}
    base["PYTHONPATH"] = os.pathsep.join(str(path) for path in pythonpath)
    for _attempt in range(3):
        port = free_port()
        ranks = [
            subprocess.Popen(
                [sys.executable, "-c", job],
                env={**base, **variables(rank, port)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=cwd,
            )
            for rank in range(2)
        ]
        outs = [rank.communicate(timeout=180) for rank in ranks]
        if all(rank.returncode == 0 for rank in ranks):
            break
        if not any("ddress already in use" in err for _, err in outs):
            break
    return [rank.returncode for rank in ranks], outs
