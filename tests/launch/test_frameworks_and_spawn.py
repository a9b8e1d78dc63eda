"""Composer and Ignite scripts under ``unidist launch``; ``unidist.spawn``; ``unidist smoke``."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import unidist
from unidist.errors import ConfigurationError, LaunchError
from unidist.launch.rank.runtime import default_start_method

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


def test_spawn_names_the_failing_rank_and_keeps_its_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(LaunchError) as caught:
        unidist.spawn(fail_on_rank_one, nproc=2, console=False)
    assert caught.value.culprit == 1
    assert "culprit: rank 1" in str(caught.value)
    assert "KeyError: 'missing shard'" in str(caught.value)
    logs = str(caught.value).split("full logs: ", 1)[1].split()[0]
    assert "missing shard" in Path(logs).read_text()


def test_a_successful_spawn_leaves_no_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert unidist.spawn(add_ranks, 0, nproc=2, console=False) == [(0, 1), (1, 1)]
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    unidist.spawn(add_ranks, 0, nproc=2, console=False, keep_logs=True)
    assert len(list(tmp_path.rglob("rank*.stdout.log"))) == 2


def ranked(local_rank: int, scale: int) -> tuple[int, str, int]:
    return local_rank, multiprocessing.get_start_method(), unidist.all_reduce(scale)


def test_spawn_passes_the_local_rank_as_ignites_parallel_does() -> None:
    fast = default_start_method()
    assert unidist.spawn(ranked, 3, nproc=2, console=False, pass_local_rank=True) == [
        (0, fast, 6),
        (1, fast, 6),
    ]  # and DataLoader workers inside start the way a script's do (fork on Linux)


def test_a_local_rank_mismatch_fails_before_anything_starts() -> None:
    with pytest.raises(ConfigurationError, match=r"pass_local_rank=True"):
        unidist.spawn(ranked, 3, nproc=2)  # would have called ranked(3) with scale missing
    with pytest.raises(ConfigurationError, match=r"spawn cannot call add_ranks"):
        unidist.spawn(add_ranks, 3, nproc=2, pass_local_rank=True)
    with pytest.raises(ConfigurationError, match=r"spawn cannot call add_ranks"):
        unidist.spawn(add_ranks, nproc=2)


def one_epoch(workers: int) -> int:
    # unidist's loader, not torch's: a worker forked while a gloo thread of the rank holds
    # CPython's HEAD_LOCK never runs (gh-112275, Python <= 3.11.9), and torch's DataLoader waits
    # for it forever. Forked just after initialize's collectives, a plain DataLoader's worker
    # hung once in 95 spawns on Python 3.11.7 (the rank polling its queue, the worker asleep on a
    # futex; a 300 s timeout in a matrix run of b33c719); unidist's starts such a worker again
    # (unidist.data._forks).
    loader = unidist.StatefulDataLoader(list(range(64)), batch_size=8, num_workers=workers)
    return sum(len(batch) for batch in loader)


def test_dataloader_workers_run_inside_spawned_ranks() -> None:
    assert unidist.spawn(one_epoch, 1, nproc=2, console=False) == [64, 64]


def test_smoke_passes_on_two_ranks() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "unidist", "smoke", "-n", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "smoke check PASSED on 2 rank(s); adapters: torch ok" in done.stdout
    from unidist.adapters import registry

    for adapter in registry.available():
        if adapter != "serial":  # a world of one only
            assert f"{adapter} ok" in done.stdout.splitlines()[-1]
            assert f"]: {adapter:<10} all_reduce       ok" in done.stdout
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
