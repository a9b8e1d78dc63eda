"""The launcher's console: which ranks reach it, and progress bars on a terminal and a pipe."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from tests.launch.helpers import SCRIPTS, launch, run_folder
from unidist.launch.plan.output import ConsoleSpec, parse_ranks, parse_std
from unidist.launch.supervise.console import Renderer

BAR = str(SCRIPTS / "bar.py")


class Terminal(io.StringIO):
    """What a program writes to a terminal (isatty), for the screen below to replay."""

    def isatty(self) -> bool:
        return True


def screen(text: str, width: int = 200) -> list[str]:
    """The lines a terminal shows after ``text`` (\\r, \\n, ESC[nA, ESC[J, ESC[K; no wrapping)."""
    lines, row, col = [""], 0, 0
    for token in re.findall(r"\x1b\[(\d*)([AJK])|(\r)|(\n)|([^\x1b\r\n]+)", text):
        count, code, cr, nl, chars = token
        if cr:
            col = 0
        elif nl:
            row, col = row + 1, 0
            lines.extend([""] * (row + 1 - len(lines)))
        elif code == "A":
            row = max(row - int(count or 1), 0)
        elif code in "JK" and code:
            lines[row] = lines[row][:col]
            if code == "J":
                del lines[row + 1 :]
        else:
            line = lines[row].ljust(col)
            lines[row] = (line[:col] + chars + line[col + len(chars) :])[:width]
            col += len(chars)
    return [line for line in lines if line]


def bar_updates(steps: int) -> list[str]:
    return [f"\r{step * 10:3d}%|{'#' * step:<10}|" for step in range(steps + 1)]


def test_a_bar_renders_in_place_on_a_terminal() -> None:
    out, err = Terminal(), Terminal()
    renderer = Renderer(out, err)
    renderer.feed("r0", "stdout", "[rank0]: ", "epoch 1\n")
    for update in bar_updates(10):
        renderer.feed("r0e", "stderr", "[rank0]: ", update)
        renderer.feed("r1e", "stderr", "[rank1]: ", update.replace("#", "="))
        assert len(screen(err.getvalue())) == 2  # one line per bar, redrawn in place
    renderer.feed("r0e", "stderr", "[rank0]: ", "\n")
    renderer.feed("r1e", "stderr", "[rank1]: ", "\n")
    assert screen(out.getvalue()) == ["[rank0]: epoch 1"]
    assert screen(err.getvalue()) == ["[rank0]: 100%|##########|", "[rank1]: 100%|==========|"]


def test_complete_lines_scroll_above_the_bars() -> None:
    err = Terminal()
    renderer = Renderer(Terminal(), err)
    renderer.feed("bar", "stderr", "[rank0]: ", "\r 40%|####")
    renderer.feed("log", "stderr", "[rank1]: ", "a warning\nanother\n")
    renderer.feed("bar", "stderr", "[rank0]: ", "\r 50%|#####")
    assert screen(err.getvalue()) == [
        "[rank1]: a warning",
        "[rank1]: another",
        "[rank0]:  50%|#####",
    ]
    renderer.finish("bar", "stderr", "[rank0]: ")  # the rank ended mid-bar: keep its last state
    assert screen(err.getvalue())[-1] == "[rank0]:  50%|#####"


def test_nested_bars_that_move_the_cursor_up_stay_in_place() -> None:
    # tqdm's bars at position 1 (Composer's Trainer): "\n", the bar, then ESC[A back up.
    updates = ["\n\r" + bar.lstrip("\r") + "\x1b[A" for bar in bar_updates(10)]
    err, piped = Terminal(), io.StringIO()
    for stream in (err, piped):
        renderer = Renderer(io.StringIO(), stream)
        renderer.feed("e", "stderr", "[rank0]: ", "Config: ...\n")
        for update in updates:
            renderer.feed("e", "stderr", "[rank0]: ", update)
        renderer.feed("e", "stderr", "[rank0]: ", "\n\ntrained\n")
        renderer.finish("e", "stderr", "[rank0]: ")
    # As a terminal shows it: the row the cursor went back to stays blank.
    expected = [
        "[rank0]: Config: ...",
        "[rank0]:",
        "[rank0]: 100%|##########|",
        "[rank0]: trained",
    ]
    assert screen(err.getvalue()) == expected
    assert piped.getvalue().splitlines() == expected


def test_a_pipe_gets_complete_lines_throttled() -> None:
    now = [0.0]
    err = io.StringIO()
    renderer = Renderer(io.StringIO(), err, throttle=5.0, clock=lambda: now[0])
    for step, update in enumerate(bar_updates(10)):
        now[0] = step * 1.0  # one update a second: a line every 5 s, then the final one
        renderer.feed("bar", "stderr", "[rank0]: ", update)
    renderer.feed("bar", "stderr", "[rank0]: ", "\n")
    renderer.feed("log", "stderr", "[rank1]: ", "no carriage return: as is\n")
    assert err.getvalue().splitlines() == [
        "[rank0]:  50%|#####     |",
        "[rank0]: 100%|##########|",
        "[rank1]: no carriage return: as is",
    ]
    assert "\r" not in err.getvalue()
    assert "\x1b" not in err.getvalue()


def test_which_ranks_and_streams_reach_the_console() -> None:
    spec = ConsoleSpec(ranks=parse_ranks("0,2-3", "--console-ranks"))
    assert [r for r in range(5) if spec.shows(r, r % 2, "stdout")] == [0, 2, 3]
    torchrun = ConsoleSpec(local_ranks=parse_ranks("1", "--local-ranks-filter"))
    assert [r for r in range(4) if torchrun.shows(r + 4, r, "stderr")] == [1]
    # torchrun's -r 3 -t 0:2: everything to files only, except local rank 0's stderr (tee'd)
    redirects, tee = parse_std("3", "-r"), parse_std("0:2", "-t")
    hidden = {k: redirects.get(k, redirects[-1]) & ~tee.get(k, 0) for k in (-1, 0)}
    spec = ConsoleSpec(hidden=hidden)
    assert spec.shows(0, 0, "stderr")
    assert not spec.shows(0, 0, "stdout")
    assert not spec.shows(1, 1, "stderr")
    assert parse_ranks("none", "--console-ranks") == frozenset()
    assert not ConsoleSpec(enabled=False).shows(0, 0, "stdout")


def _pty_run(args: list[str], columns: int = 160) -> str:
    """Run a command with its stdout and stderr on a pseudo-terminal; what it wrote there."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=child, stderr=child)
    os.close(child)
    chunks = []
    try:
        while True:
            try:
                data = os.read(main, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        process.wait(timeout=180)
    finally:
        process.kill()
        os.close(main)
    assert process.returncode == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.multiprocess
def test_a_ranks_progress_bar_on_a_terminal_shows_as_one_line(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "unidist", "launch", "-n", "2", "--console-ranks", "0"]
    written = _pty_run([*command, "--log-dir", str(tmp_path), BAR])
    shown = screen(written)
    bars = [line for line in shown if "30/30" in line or "%|" in line]
    assert len(bars) == 1, shown  # the bar was redrawn in place, not one line per update
    assert bars[0].startswith("[rank0]: rank0:")
    assert "100%" in bars[0]
    assert "[rank0]: rank 0 starts" in shown
    assert "[rank0]: rank 0 done" in shown
    assert not [line for line in shown if "[rank1]" in line]  # --console-ranks 0
    assert len(shown) <= 4, shown
    # The files get everything, every update included.
    log = (run_folder(tmp_path) / "rank1.stderr.log").read_bytes()
    assert log.count(b"\r") >= 30


@pytest.mark.multiprocess
def test_a_ranks_progress_bar_on_a_pipe_is_one_complete_line(tmp_path: Path) -> None:
    done = launch("-n", "2", "--local-ranks-filter", "1", "--log-dir", str(tmp_path), BAR)
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr
    bars = [line for line in done.stderr.splitlines() if "%|" in line]
    assert len(bars) == 1, done.stderr  # a short bar: only its final state
    assert bars[0].startswith("[rank1]: rank1:")
    assert "100%" in bars[0]
    assert "[rank0]" not in done.stdout + done.stderr  # torchrun's --local-ranks-filter 1
