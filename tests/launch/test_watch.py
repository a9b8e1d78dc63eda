"""The watchdog's per-rank state machine: every move of the diagram, and only those."""

from __future__ import annotations

import pytest

from unidist.launch.supervise.watch import Observed, RankState, RankWatch, advance


@pytest.mark.parametrize(
    ("failed", "finished", "state"),
    [
        (True, False, RankState.FAILED),
        (False, True, RankState.FINISHED),
        (False, False, RankState.EXITED),  # reaped by torch's agent first, nothing recorded
    ],
)
def test_a_running_rank_that_exits(failed: bool, finished: bool, state: RankState) -> None:
    watch = RankWatch()
    advance(watch, "running", 3)
    advance(watch, "exited", 5, status=1 if failed else None, failed=failed, finished=finished)
    assert (watch.state, watch.alive_at, watch.gone_at, watch.failed_exit) == (
        state,
        3,
        5,
        failed,
    )


def test_a_rank_the_launcher_stops() -> None:
    watch = RankWatch()
    advance(watch, "stop", 7, frozen=True)
    assert (watch.state, watch.stopped_at, watch.frozen) == (RankState.STOPPING, 7, True)
    advance(watch, "running", 8)  # still there until it acts on SIGTERM
    assert watch.state is RankState.STOPPING
    advance(watch, "exited", 9, status=-15, failed=True)
    assert (watch.state, watch.status, watch.failed_exit) == (RankState.STOPPED, -15, True)


def test_a_rank_killed_at_the_exit_timeout_stays_overdue_when_it_is_gone() -> None:
    watch = RankWatch()
    advance(watch, "overdue", 4)
    advance(watch, "exited", 6, status=-9, failed=True)
    assert (watch.state, watch.overdue_at, watch.gone_at) == (RankState.OVERDUE, 4, 6)


def test_only_the_first_exit_counts_and_a_gone_rank_is_not_revived() -> None:
    watch = RankWatch()
    advance(watch, "exited", 5, status=0, finished=True)
    advance(watch, "exited", 9, status=1, failed=True)
    advance(watch, "stop", 10)
    advance(watch, "overdue", 11)
    assert (watch.state, watch.gone_at, watch.status) == (RankState.FINISHED, 5, 0)
    assert (watch.stopped_at, watch.overdue_at) == (None, None)


def test_an_unknown_event_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown supervisor event 'paused'"):
        advance(RankWatch(), "paused", 1)


def test_observed_keeps_one_watch_per_rank_and_lists_the_failed() -> None:
    seen = Observed()
    advance(seen.watch(1), "exited", 5, status=3, failed=True)
    advance(seen.watch(0), "running", 5)
    assert seen.watch(1) is seen.ranks[1]
    assert seen.failed == {1}
    assert seen.get(7).state is RankState.RUNNING
    assert 7 not in seen.ranks


def test_a_sigterm_from_outside_is_left_to_torchs_agent() -> None:
    # torch's agent SIGTERMs every rank when a node joins: not a failure for the watchdog to
    # act on (stopping the survivors, telling other nodes), though it is on record.
    seen = Observed()
    advance(seen.watch(0), "exited", 5, status=-15, failed=True)
    advance(seen.watch(1), "exited", 6, status=1, failed=True)
    advance(seen.watch(2), "stop", 6)
    advance(seen.watch(2), "exited", 7, status=-15, failed=True)
    advance(seen.watch(3), "exited", 7, status=-9, failed=True)
    assert seen.get(0).terminated
    assert not seen.get(2).terminated  # the launcher's own SIGTERM
    assert seen.failed == {0, 1, 2, 3}
    assert seen.failed_on_their_own == {1, 2, 3}


def test_sightings_are_an_enum_whose_values_are_the_words() -> None:
    from unidist.launch.supervise.watch import Sighting as Event

    watch = RankWatch()
    advance(watch, Event.STOP, 2)
    advance(watch, Event.EXITED, 3, status=-15, failed=True)
    assert watch.state is RankState.STOPPED
    assert [e.value for e in Event] == ["running", "exited", "stop", "overdue"]
    assert Event("overdue") is Event.OVERDUE
