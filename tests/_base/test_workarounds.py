"""Each torch bug unidist works around: the workaround works where the bug exists, and where it is
not applied (a fixed torch) the bug is absent. Which of the two runs depends on the installed
torch, so the pinned environment (torch 2.7) and the latest one (the newest torch) cover both.
The CPython bug's gate is checked here on every side; its workaround in tests/data/test_forks.py.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import unidist
from unidist._base import workarounds as _workarounds
from unidist._base.workarounds import (
    FORK_HEAD_LOCK,
    GLOO_AVG_SUMS,
    GLOO_NO_AVG_ALL_REDUCE,
    GLOO_TEARDOWN_DEADLOCK,
    LIBUV_STORE_LISTEN_FD,
    PYTHON_BUGS,
    STATIC_STORE_REUSED,
    STORE_LISTENS_EVERYWHERE,
    TORCH_BUGS,
    replace_c10d_store,
    replace_dataloader_worker,
    torch_release,
)
from unidist.testing import run_distributed

#: Rounds of start, collectives, destroy: without the workaround, torch 2.7 hung in 5 of 5 runs
#: of 10 rounds on this project's machines; fixed releases and the workaround, 0 of 5.
ROUNDS = 10


def test_versions_are_read_from_torch_strings() -> None:
    assert torch_release("2.7.0+cu126") == (2, 7)
    assert torch_release("2.14.1") == (2, 14)
    assert torch_release("2.11.0a0+git1234") == (2, 11)
    assert GLOO_TEARDOWN_DEADLOCK.present("2.7.0")
    assert not GLOO_TEARDOWN_DEADLOCK.present("2.8.0")
    assert GLOO_AVG_SUMS.affected == "torch < 2.9"
    assert torch_release() == torch_release(torch.__version__)
    with pytest.raises(ValueError, match="cannot read a torch version"):
        torch_release("nightly")


def test_every_bug_names_its_upstream_reference() -> None:
    for bug in TORCH_BUGS:
        assert "pytorch" in bug.upstream
        assert bug.summary
        assert bug.fixed_in is None or bug.fixed_in >= (2, 5)


def test_a_bug_no_release_has_fixed_is_present_on_every_torch() -> None:
    for bug in (STATIC_STORE_REUSED, STORE_LISTENS_EVERYWHERE):
        assert [bug.present("2.7.0"), bug.present("2.14.1"), bug.present()] == [True] * 3
        assert bug.affected == "every torch release so far"
    assert LIBUV_STORE_LISTEN_FD.affected == "torch < 2.8"


def test_replace_c10d_store_patches_torchs_private(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib

    rendezvous = importlib.import_module("torch.distributed.rendezvous")
    original = rendezvous._create_c10d_store
    monkeypatch.setattr(rendezvous, "_create_c10d_store", original)  # restored after the test
    seen: list[object] = []

    def wrap(create: object) -> object:
        seen.append(create)
        return lambda *args, **kwargs: ("wrapped", args)

    assert replace_c10d_store(wrap) is True
    assert seen == [original]
    assert rendezvous._create_c10d_store("h", 1) == ("wrapped", ("h", 1))
    monkeypatch.delattr(rendezvous, "_create_c10d_store")  # a torch without it: no patch
    assert replace_c10d_store(wrap) is False


@pytest.mark.parametrize(
    ("version", "present"),
    [
        ((3, 9, 20), True),  # a line older than every one listed: taken to have it
        ((3, 10, 0), True),
        ((3, 10, 14), True),
        ((3, 10, 15), False),
        ((3, 10, 18), False),
        ((3, 11, 7), True),
        ((3, 11, 9), True),
        ((3, 11, 10), False),
        ((3, 11, 14), False),
        ((3, 12, 0), False),
        ((3, 13, 5), False),
        ((3, 14, 0), False),
    ],
)
def test_the_fork_head_lock_bug_is_present_only_before_its_fix(
    version: tuple[int, int, int], present: bool
) -> None:
    assert FORK_HEAD_LOCK.present(version) is present


def test_a_python_bug_reads_the_running_python(monkeypatch: pytest.MonkeyPatch) -> None:
    running = (sys.version_info.major, sys.version_info.minor, sys.version_info.micro)
    assert _workarounds.python_version() == running
    assert FORK_HEAD_LOCK.present() is FORK_HEAD_LOCK.present(running)
    monkeypatch.setattr(_workarounds, "python_version", lambda: (3, 11, 9))
    assert FORK_HEAD_LOCK.present()
    monkeypatch.setattr(_workarounds, "python_version", lambda: (3, 12, 0))
    assert not FORK_HEAD_LOCK.present()
    assert FORK_HEAD_LOCK.affected == "Python 3.10 < 3.10.15, 3.11 < 3.11.10"


def test_every_python_bug_names_its_upstream_reference() -> None:
    for bug in PYTHON_BUGS:
        assert "CPython gh-" in bug.upstream
        assert bug.summary
        assert list(bug.fixed_in) == sorted(bug.fixed_in)  # oldest line first, one per line
        assert len({fixed[:2] for fixed in bug.fixed_in}) == len(bug.fixed_in)


def test_replace_dataloader_worker_swaps_the_worker_and_its_registered_pids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch.utils.data._utils import signal_handling

    calls: list[tuple[object, ...]] = []
    monkeypatch.setattr(signal_handling, "_remove_worker_pids", lambda key: calls.append((key,)))
    monkeypatch.setattr(
        signal_handling, "_set_worker_pids", lambda key, pids: calls.append((key, pids))
    )
    other, stuck, fresh = (SimpleNamespace(pid=pid) for pid in (11, 12, 13))
    iterator = SimpleNamespace(_workers=[other, stuck], _worker_pids_set=False)
    replace_dataloader_worker(iterator, stuck, fresh)  # pids not registered yet: torch will
    assert iterator._workers == [other, fresh]
    assert calls == []
    iterator._worker_pids_set = True
    replace_dataloader_worker(iterator, fresh, stuck)
    assert iterator._workers == [other, stuck]
    assert calls == [(id(iterator),), (id(iterator), (11, 12))]


def _collectives_then_free() -> None:
    for _ in range(20):
        tensor = torch.ones(1000)
        dist.all_reduce(tensor)
        parts = [torch.empty(1000) for _ in range(2)]
        dist.all_gather(parts, tensor)
        del tensor, parts  # gloo's workers may now drop the last references


def raw_teardown_rounds(rounds: int) -> int:
    """Start a gloo group, use it, destroy it at once: torch alone, no workaround."""
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        2,
        int(os.environ["RANK"]) == 0,
        timeout=timedelta(seconds=30),
    )
    for round_ in range(rounds):
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(f"round{round_}", store),
            rank=int(os.environ["RANK"]),
            world_size=2,
        )
        _collectives_then_free()
        dist.destroy_process_group()
    return rounds


def unidist_teardown_rounds(rounds: int) -> int:
    """The same through unidist.initialize/finalize (where the workaround lives)."""
    for _ in range(rounds):
        unidist.initialize("gloo")
        _collectives_then_free()
        unidist.finalize()
    return rounds


@pytest.mark.multiprocess
def test_gloo_teardown_does_not_deadlock() -> None:
    """torch < 2.8: through unidist.finalize (the workaround); later: torch alone, no workaround."""
    rounds = unidist_teardown_rounds if GLOO_TEARDOWN_DEADLOCK.present() else raw_teardown_rounds
    assert run_distributed(rounds, ROUNDS, init=False, timeout=120) == [ROUNDS, ROUNDS]


def test_finalize_pauses_only_where_the_deadlock_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    from unidist.session import lifecycle

    pauses: list[float] = []
    monkeypatch.setattr(time, "sleep", pauses.append)
    monkeypatch.setattr(gc, "collect", lambda: 0)
    session = unidist.initialize("gloo")  # a world of one still builds a torch group
    assert session.world_size == 1
    lifecycle.finalize()
    assert bool(pauses) == GLOO_TEARDOWN_DEADLOCK.present()


def gloo_averages() -> tuple[float, float | str, bool | None]:
    """What gloo's AVG gives (1.0 averaged, 2.0 summed), and whether unidist corrects FSDP2."""
    from torch.distributed.fsdp import fully_shard

    from unidist.parallel._gloo import correct_gloo_averaging

    out = torch.empty(1)
    dist.reduce_scatter_tensor(out, torch.ones(2), op=dist.ReduceOp.AVG)
    try:
        reduced = torch.ones(1)
        dist.all_reduce(reduced, op=dist.ReduceOp.AVG)
        all_reduce: float | str = reduced.item()
    except RuntimeError as exc:
        all_reduce = f"refused: {exc}"[:60]
    model = torch.nn.Linear(4, 4)
    fully_shard(model)
    return out.item(), all_reduce, correct_gloo_averaging(model)


@pytest.mark.multiprocess
def test_gloo_averaging_bugs_match_their_version_gates() -> None:
    """Where the gate says the bug exists, it does and unidist corrects it; elsewhere neither."""
    for reduce_scatter, all_reduce, corrected in run_distributed(gloo_averages):
        if GLOO_AVG_SUMS.present():
            assert reduce_scatter == 2.0, "gloo averaged: the gate claims a bug that is gone"
            assert corrected is True
        else:
            assert reduce_scatter == 1.0, "gloo summed: the bug is still there past the gate"
            assert corrected is False  # nothing installed, no probe
        if GLOO_NO_AVG_ALL_REDUCE.present():
            assert isinstance(all_reduce, str)
            assert all_reduce.startswith("refused")
        else:
            assert all_reduce == 1.0
