"""The rules that call a hang and name its culprit, and the straggler rule, on facts alone."""

from __future__ import annotations

import pytest

from unidist.hangs.verdict import (
    FACTOR,
    FLOOR,
    WARM_UP,
    WARM_UP_FLOOR,
    Deadline,
    RankFacts,
    ranks_text,
    stragglers,
    verdict,
)


def fact(rank: int, status: str = "running", state: str = "collective", **kw: object) -> RankFacts:
    values: dict[str, object] = {"op": "all_reduce", "seq": 12, "frame": "/x/train.py:57 step"}
    values.update(kw)
    return RankFacts(rank, 0, "vm", status, state, **values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("facts", "said"),
    [
        (
            [fact(0), fact(1, state="user", seq=11, frame="/x/train.py:57 slow_step"), fact(2)],
            "rank 1 is in user code at train.py:57 in slow_step while ranks 0, 2 wait in "
            "all_reduce #12",
        ),
        (
            [fact(0), fact(1, op="broadcast")],
            "ranks diverged: rank 0 in all_reduce #12, rank 1 in broadcast #12",
        ),
        (
            [fact(0, seq=13), fact(1, seq=12, op="barrier")],
            "rank 1 waits in barrier #12 while rank 0 waits in all_reduce #13",
        ),
        (
            [fact(0), fact(1), fact(2), fact(3, status="exited", exit_code=0, steps=812)],
            "rank 3 exited with code 0 at step 812 while ranks 0-2 wait in all_reduce #12",
        ),
        (
            [fact(0), fact(1, status="frozen", state="user")],
            "rank 1 is frozen (SIGSTOP or a debugger) at train.py:57 in step while rank 0 waits",
        ),
        (
            [fact(0), RankFacts(1, 1, "node 1", "silent")],
            "rank 1 on node 1 stopped answering (host lost?) while rank 0 waits in all_reduce #12",
        ),
        (
            [fact(0), fact(1)],
            "every rank waits in all_reduce #12: the collective itself does not complete",
        ),
        (
            [fact(0, state="backward", seq=30), fact(1, state="user", seq=29)],
            "rank 1 is in user code at train.py:57 in step while rank 0 waits in backward "
            "(its DDP/FSDP collectives, #30 issued)",
        ),
        (
            [fact(0, status="exited", exit_code=0), fact(1, state="user")],
            "rank 1 is in user code at train.py:57 in step; rank 0 exited with code 0",
        ),
        (
            [fact(0), fact(1, state="data")],
            "rank 1 waits for its DataLoader at train.py:57 in step while rank 0 waits",
        ),
    ],
)
def test_the_verdict_names_who_is_stuck_and_where(facts: list[RankFacts], said: str) -> None:
    assert verdict(facts).startswith(said), verdict(facts)


def test_ranks_are_written_as_runs() -> None:
    assert ranks_text([3]) == "rank 3"
    assert ranks_text([0, 2]) == "ranks 0, 2"
    assert ranks_text([0, 1, 2, 3, 7, 8]) == "ranks 0-3, 7, 8"


def test_a_fixed_timeout_is_the_silence_allowed_and_zero_is_never() -> None:
    deadline = Deadline(10.0, started=0.0)
    deadline.progress(5.0)
    assert not deadline.expired(14.9)
    assert deadline.expired(15.0)
    never = Deadline(0.0, started=0.0)
    assert not never.expired(10**9)


def test_the_default_waits_out_the_warm_up_then_scales_with_the_longest_silence() -> None:
    deadline = Deadline(None, started=0.0)
    assert deadline.timeout(1.0) == WARM_UP_FLOOR  # imports, downloads, compiling
    assert not deadline.expired(WARM_UP_FLOOR - 1)
    assert deadline.expired(WARM_UP_FLOOR)
    for now in range(1, 2000):  # one step a second for a while
        deadline.progress(float(now))
    assert deadline.timeout(2000.0) == FLOOR  # after the warm-up, at least 2 minutes
    deadline.progress(2029.0)  # a 30 s checkpoint save after the last step (at 1999)
    assert deadline.timeout(2030.0) == FACTOR * 30


def test_a_slow_but_steady_job_is_never_stopped_by_the_default() -> None:
    # Steps of 40 s to 3 minutes, for days: the silence is never ten times the longest yet.
    deadline = Deadline(None, started=0.0)
    now = 0.0
    for i in range(5000):
        step = 40.0 + (i * 37 % 140)
        for t in range(int(step)):
            assert not deadline.expired(now + t), (i, now + t)
        now += step
        deadline.progress(now)
    assert now > WARM_UP * 100


def test_a_straggler_is_the_rank_whose_time_outside_collectives_stands_out() -> None:
    fast = {"user": 20, "comm": 80, "data": 0, "backward": 0}
    slow = {"user": 95, "comm": 5, "data": 0, "backward": 0}
    found = stragglers([fact(0, samples=fast), fact(1, samples=slow), fact(2, samples=fast)])
    assert [s.rank for s in found] == [1]
    assert found[0].phase == "compute"
    assert found[0].ratio == pytest.approx(95 / 20)
    assert "rank 1 (node 0, vm) is 4.7x slower than the median rank" in found[0].line()
    loading = {"user": 10, "comm": 10, "data": 80, "backward": 0}
    assert stragglers([fact(0, samples=fast), fact(1, samples=loading)])[0].phase == "data loading"
    even = [fact(r, samples=fast) for r in range(4)]
    assert stragglers(even) == []
    few = {"user": 9, "comm": 1}
    assert stragglers([fact(0, samples=fast), fact(1, samples=few)]) == []  # too few looks
