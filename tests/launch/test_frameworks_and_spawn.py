"""Composer and Ignite scripts under ``unidist launch``; ``unidist.spawn``; ``unidist smoke``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import unidist
from unidist.errors import LaunchError

pytestmark = pytest.mark.multiprocess

SCRIPTS = Path(__file__).parents[1] / "scripts"


def launch(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unidist", "launch", "--log-dir", str(tmp), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ},
    )


@pytest.mark.composer
def test_a_composer_trainer_runs_under_unidist_launch(tmp_path: Path) -> None:
    done = launch("-n", "2", str(SCRIPTS / "composer_trainer.py"), tmp=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        assert (
            f"composer trainer done on rank {rank} of 2 node 0; unidist says rank {rank} of 2"
        ) in done.stdout


@pytest.mark.ignite
def test_an_ignite_engine_runs_under_unidist_launch(tmp_path: Path) -> None:
    done = launch("-n", "2", str(SCRIPTS / "ignite_engine.py"), tmp=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        assert f"ignite engine done on rank {rank} of 2" in done.stdout
        assert f"unidist says rank {rank} of 2" in done.stdout


def add_ranks(offset: int) -> tuple[int, int]:
    return unidist.get_rank(), unidist.all_reduce(unidist.get_rank() + offset)


def fail_on_rank_one() -> None:
    if unidist.get_rank() == 1:
        raise KeyError("missing shard")
    unidist.barrier()


def test_spawn_returns_every_ranks_result(tmp_path: Path) -> None:
    assert unidist.spawn(add_ranks, 10, nproc=2, log_dir=tmp_path, console=False) == [
        (0, 21),
        (1, 21),
    ]


def test_spawn_names_the_failing_rank(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as caught:
        unidist.spawn(fail_on_rank_one, nproc=2, log_dir=tmp_path, console=False)
    assert caught.value.culprit == 1
    assert "culprit: rank 1" in str(caught.value)
    assert "KeyError: 'missing shard'" in str(caught.value)


def test_smoke_passes_on_two_ranks() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "unidist", "smoke", "-n", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "smoke check PASSED on 2 rank(s)" in done.stdout
    for check in (
        "all_reduce",
        "all_gather",
        "objects",
        "broadcast",
        "barrier",
        "groups",
        "sampler",
    ):
        assert f"{check} " in done.stdout
