"""The launcher's hang watch on its own: what it reads of the ranks' records, start by start, and
how its reports are shown (no processes: records written in place, a clock of the test's)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from unidist.hangs import page as record
from unidist.hangs.verdict import RankFacts
from unidist.launch.records import Slot, Start
from unidist.launch.supervise.hang import HangReport, HangWatch, render
from unidist.launch.supervise.watch import Observed


def _slots(folder: Path, world: int = 2) -> dict[int, Slot]:
    return {
        r: Slot(r, r, 0, world, folder / f"r{r}.out", folder / f"r{r}.err") for r in range(world)
    }


def _write(events: Path, rank: int, start: int, **values: int | str) -> None:
    writer = record.Writer(record.path_for(events, rank, start))
    writer.values.update(beat=time.monotonic_ns(), **values)
    writer.flush()
    writer.close()


def test_a_restart_forgets_what_the_previous_start_recorded(tmp_path: Path) -> None:
    now = [0.0]
    watch = HangWatch(tmp_path, fixed=5, clock=lambda: now[0])
    slots = _slots(tmp_path)
    for rank in (0, 1):
        _write(tmp_path, rank, 0, steps=40, all_seq=90, state=1, frame="old.py:3 f")
    watch.look(Start(0, slots), Observed())
    # The restart: rank 0 has written its first record, rank 1 none yet.
    _write(tmp_path, 0, 1, steps=1, all_seq=2, state=1, frame="new.py:7 g")
    now[0] = 1.0
    watch.look(Start(1, slots), Observed())
    facts = watch.facts(Start(1, slots), {}, Observed(), {}, lambda pid: False)
    assert [(f.rank, f.status, f.steps, f.frame) for f in facts] == [
        (0, "running", 1, "new.py:7 g"),
        (1, "unknown", 0, ""),  # never the previous start's step 40 at old.py
    ]
    assert watch.snapshots.keys() == {0}  # rank 0's new record alone


def _report(frame: str, host: str = "h") -> HangReport:
    fact = RankFacts(1, 0, host, "running", "user", frame=frame, steps=3)
    return HangReport("rank 1 is in user code", 30.0, 20.0, "--hang-timeout 20", [fact])


def test_escape_sequences_in_a_frame_are_never_printed_raw(tmp_path: Path) -> None:
    evil = "/tmp/\x1b]0;owned\x07x\x1b[2J.py:5 f\x1b[31mn"
    text = _report(evil, host="h\x1b[1m").format()
    assert not {"\x1b", "\x07"} & set(text), repr(text)
    assert "\\x1b" in text  # shown, escaped: the reader still sees something was there
    (tmp_path / "hang.json").write_text(json.dumps(_report(evil).to_json()))
    again = render(tmp_path)
    assert not {"\x1b", "\x07"} & set(again), repr(again)


def test_unidist_report_on_a_damaged_hang_json_says_so_in_one_line(tmp_path: Path) -> None:
    for damaged in (
        {"kind": "hang", "ranks": [{"rank": "one", "node": [], "host": {}, "status": 5}]},
        {"kind": "hang", "silence_s": "long", "timeout_s": None, "ranks": 7},
        {"kind": "hang", "ranks": [{"rank": 1, "frame": {"file": [], "line": "x"}}]},
        {"kind": "stragglers", "seconds": "x", "stragglers": 3},
    ):
        (tmp_path / "hang.json").write_text(json.dumps(damaged))
        done = subprocess.run(
            [sys.executable, "-m", "unidist", "report", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "Traceback" not in done.stderr, (damaged, done.stderr)
        lines = (done.stdout + done.stderr).strip().splitlines()
        assert len(lines) == 1, (damaged, lines)
        assert "hang.json: not a unidist report" in lines[0], lines


def test_numbers_too_large_for_a_float_are_a_damaged_report_not_a_traceback(
    tmp_path: Path,
) -> None:
    huge = 10**400  # JSON reads it; float() cannot
    for damaged in (
        {"kind": "hang", "silence_s": huge, "ranks": []},
        {"kind": "hang", "ranks": [{**_report("a.py:1 f").facts[0].to_json(), "stuck_s": huge}]},
        {"kind": "stragglers", "seconds": 3, "stragglers": [_straggler(ratio=huge)]},
    ):
        (tmp_path / "hang.json").write_text(json.dumps(damaged))
        text = render(tmp_path)
        assert "hang.json: not a unidist report" in text, text
    assert RankFacts.from_json({**_report("a.py:1 f").facts[0].to_json(), "silent_s": huge}) is None


def _straggler(**change: object) -> dict[str, object]:
    phases = {"compute": 0.8, "data": 0.1, "communication": 0.1}
    found = {"rank": 1, "node": 0, "host": "h", "ratio": 2.0, "phase": "compute"}
    return {**found, "busy": 0.9, "median_busy": 0.4, "phases": phases, **change}


def test_an_earlier_attempts_hang_is_printed_escaped_in_the_summary() -> None:
    from unidist.launch.supervise.report import Report

    earlier = Report([], None, 125)
    earlier.hang = _report("/x/\x1b]0;owned\x07.py:1 f")
    earlier.hang.verdict = "rank 1 is in user code at \x1b[2Jx.py:1 in f"
    text = Report([], None, 0, earlier=[earlier]).format()
    assert "attempt 0 hung" in text, text
    assert not {"\x1b", "\x07"} & set(text), repr(text)


def test_the_progress_count_only_grows_though_a_ranks_steps_go_down(tmp_path: Path) -> None:
    # A rank's steps are its loader's batches until a ResumableState counts them: 40 batches
    # of an evaluation pass, then step 1. The count other nodes read must still grow.
    now = [0.0]
    watch = HangWatch(tmp_path, fixed=5, clock=lambda: now[0])
    start = Start(0, _slots(tmp_path, world=1))
    counts = []
    for steps in (40, 41, 1, 2):
        _write(tmp_path, 0, 0, steps=steps, state=1, frame="a.py:1 f")
        now[0] += 1
        watch.look(start, Observed())
        counts.append(watch.progress_count())
    assert counts == sorted(counts)
    assert counts[-1] > counts[0]


def test_the_count_for_other_nodes_holds_this_nodes_moves_alone(tmp_path: Path) -> None:
    # The relay adds each node's count to the job's; counting what comes back from the others
    # (the job's count moving) would make two silent nodes move each other for ever.
    now = [0.0]
    watch = HangWatch(tmp_path, fixed=5, clock=lambda: now[0])
    start = Start(0, _slots(tmp_path, world=1))
    _write(tmp_path, 0, 0, steps=3, state=2, op="all_reduce")
    watch.look(start, Observed(), elsewhere=10)
    for elsewhere in (11, 12, 13):
        now[0] += 1
        watch.look(start, Observed(), elsewhere=elsewhere)
    assert watch.progress_count() == 0  # the job moved, through the others; this node did not
    assert watch.deadline.silence(now[0]) == 0  # but the job's progress is progress here
