"""The launcher's hang watch on its own: what it reads of the ranks' records, start by start, and
how its reports are shown (no processes: records written in place, a clock of the test's)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from unidist._progress import record
from unidist._progress.verdict import RankFacts
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
    assert watch.progress_count() == 1 + 2  # rank 0's new record alone


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
