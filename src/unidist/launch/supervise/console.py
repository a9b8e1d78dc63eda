"""The launcher's console: which ranks reach it, and progress bars that stay readable.

Every rank writes its whole output to its own files; this module copies the chosen ranks' files
to the launcher's console, each line prefixed by its rank. Carriage-return updates (tqdm,
Composer's progress bars) are redrawn in place on a terminal, one line per bar at the bottom of
the screen with the completed lines scrolling above it; on a pipe or a file they are throttled to
complete lines (the state of a bar at most every few seconds, and its final state), so a log does
not get one line per update.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TextIO

__all__ = ["Console", "Renderer"]

#: A cursor movement (ESC[nA up, ESC[K erase to the end of the row), a line break, or text.
_TOKENS = re.compile(r"\x1b\[(\d*)([AK])|(\r\n|\r|\n|[^\r\n\x1b]+|\x1b)")
#: Seconds between two lines showing the same unfinished (carriage-return) line on a pipe.
THROTTLE = 5.0


class _Screen:
    """One stream's output as a terminal holds it: rows the cursor can still reach are live.

    Text overwrites from the cursor, ``\r`` returns to the row's start, ``\n`` moves down, and
    ``ESC[nA`` moves up (tqdm's nested bars, Composer's progress bars). A row is complete once
    the cursor is further below it than it has ever moved up: nothing can change it any more.
    Moving up past the live rows (the first time a program does it) reopens rows above; those
    are complete again, unprinted, if nothing is written to them.
    """

    def __init__(self) -> None:
        self.rows = [""]  # the live rows; rows[0] has the absolute number ``base``
        self.base = 0
        self.row = 0
        self.col = 0
        self.reach = 0  # the furthest the cursor ever moved up
        self.reopened = 0  # rows[:reopened] were complete once already

    def write(self, data: str) -> list[tuple[int, str]]:
        """Apply ``data``; returns the rows it completed (absolute number, text)."""
        done: list[tuple[int, str]] = []
        for up, code, text in _TOKENS.findall(data):
            if code == "A":
                self._up(int(up or 1))
            elif code == "K":
                self.rows[self.row] = self.rows[self.row][: self.col]
            elif text == "\r":
                self.col = 0
            elif text in ("\n", "\r\n"):
                self.row, self.col = self.row + 1, 0
                if self.row == len(self.rows):
                    self.rows.append("")
                done.extend(self._complete(self.row - self.reach))
            elif text:
                line = self.rows[self.row].ljust(self.col)
                self.rows[self.row] = line[: self.col] + text + line[self.col + len(text) :]
                self.col += len(text)
        return done

    def _up(self, count: int) -> None:
        self.reach = max(self.reach, count)
        above = min(count - self.row, self.base)
        if above > 0:  # back into rows already printed: reopen them, blank
            self.rows[:0] = [""] * above
            self.base, self.row, self.reopened = self.base - above, self.row + above, above
        self.row = max(self.row - count, 0)

    def _complete(self, count: int) -> list[tuple[int, str]]:
        if count <= 0:
            return []
        done = [
            (self.base + i, text)
            for i, text in enumerate(self.rows[:count])
            if text or i >= self.reopened  # a reopened row nobody wrote to was printed already
        ]
        self.rows = self.rows[count:]
        self.base, self.row = self.base + count, self.row - count
        self.reopened = max(self.reopened - count, 0)
        return done

    def live(self) -> dict[int, str]:
        """Absolute row number -> text, for the live rows that show something."""
        return {self.base + i: text for i, text in enumerate(self.rows) if text.strip()}

    def close(self) -> list[tuple[int, str]]:
        """The stream ended: every row is complete, but blank rows at the end are only where the
        cursor rested (after a bar cleared itself, say)."""
        count = len(self.rows)
        while count and not self.rows[count - 1].strip():
            count -= 1
        return self._complete(count)


class _Sink:
    """One console stream; on a terminal it owns the block of in-place lines at the bottom."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = _isatty(stream)
        self.block: dict[Hashable, str] = {}
        self.drawn = 0  # lines of the block now on the screen

    def render(self, lines: list[str], updates: Mapping[Hashable, str | None]) -> None:
        out: list[str] = []
        if self.tty and self.drawn:
            up = f"\x1b[{self.drawn - 1}A" if self.drawn > 1 else ""
            out.append(f"\r{up}\x1b[J")  # back to the block's first line, clear to the end
        out.extend(line + "\n" for line in lines)
        for key, text in updates.items():
            if text is None:
                self.block.pop(key, None)
            else:
                self.block[key] = text
        self.drawn = 0
        if self.tty and self.block:
            width = _width(self.stream)
            out.append("\n".join(text[: width - 1] for text in self.block.values()))
            self.drawn = len(self.block)
        if out:
            self.stream.write("".join(out))
            self.stream.flush()


class Renderer:
    """Turns each rank's output, chunk by chunk, into console lines (see the module docstring)."""

    def __init__(
        self,
        out: TextIO,
        err: TextIO,
        throttle: float = THROTTLE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        err_sink = _Sink(err)
        out_sink = err_sink if _same_terminal(out, err) else _Sink(out)
        self._sinks = {"stdout": out_sink, "stderr": err_sink}
        self._screens: dict[Hashable, _Screen] = {}
        self._since: dict[tuple[Hashable, int], float] = {}  # live row -> when it appeared
        self._shown: dict[tuple[Hashable, int], tuple[str, float]] = {}  # on a pipe
        self._throttle = throttle
        self._clock = clock

    def feed(self, key: Hashable, stream: str, prefix: str, data: str) -> None:
        """Add output of one stream (``key``) of one rank."""
        screen = self._screens.setdefault(key, _Screen())
        self._render(key, stream, prefix, screen.write(data), screen.live())

    def tick(self, prefixes: Mapping[Hashable, tuple[str, str]]) -> None:
        """On a pipe, print live rows that waited long enough (key -> stream, prefix)."""
        for key, (stream, prefix) in prefixes.items():
            screen = self._screens.get(key)
            if screen is not None and not self._sinks[stream].tty:
                self._render(key, stream, prefix, [], screen.live())

    def finish(self, key: Hashable, stream: str, prefix: str) -> None:
        """The stream ended: its live rows become complete lines."""
        screen = self._screens.pop(key, None)
        if screen is not None:
            self._render(key, stream, prefix, screen.close(), {})

    def _render(
        self,
        key: Hashable,
        stream: str,
        prefix: str,
        done: list[tuple[int, str]],
        live: dict[int, str],
    ) -> None:
        sink, now = self._sinks[stream], self._clock()
        lines: list[str] = []
        for number, text in done:
            shown = self._shown.pop((key, number), None)
            self._since.pop((key, number), None)
            if sink.tty or shown is None or shown[0] != text:
                lines.append((prefix + text).rstrip())
        if sink.tty:
            gone = [k for k in sink.block if k[0] == key and k[1] not in live]  # type: ignore[index]
            updates: dict[Hashable, str | None] = dict.fromkeys(gone)
            updates.update({(key, number): prefix + text for number, text in live.items()})
            sink.render(lines, updates)
            return
        for number, text in live.items():  # a pipe: unfinished rows, throttled
            since = self._since.setdefault((key, number), now)
            shown = self._shown.get((key, number))
            last = shown[1] if shown else since
            if (shown is None or shown[0] != text) and now - last >= self._throttle:
                lines.append(prefix + text)
                self._shown[(key, number)] = (text, now)
        sink.render(lines, {})


@dataclass
class _Follow:
    path: Path
    stream: str
    prefix: str
    handle: BinaryIO | None = None
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )

    def read(self) -> str:
        if self.handle is None:
            try:  # never through a link: the file is the one unidist created
                fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                return ""
            self.handle = os.fdopen(fd, "rb")  # kept open while followed
        return self.decoder.decode(self.handle.read() or b"")


class Console(threading.Thread):
    """Follows rank log files and renders them (a daemon thread; :meth:`close` at the end)."""

    def __init__(
        self, out: TextIO, err: TextIO, interval: float = 0.05, throttle: float = THROTTLE
    ) -> None:
        super().__init__(name="unidist-launch-console", daemon=True)
        self._renderer = Renderer(out, err, throttle)
        self._follows: list[_Follow] = []
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._interval = interval
        self._broken = False

    def follow(self, path: Path, stream: str, prefix: str) -> None:
        """Start copying ``path`` (a rank's ``stream``) to the console."""
        with self._lock:
            self._follows.append(_Follow(path, stream, prefix))

    def retire(self) -> None:
        """Copy what is left of the files followed so far and stop following them (a restart)."""
        with self._lock:
            old, self._follows = self._follows, []
            for follow in old:
                self._drain(follow, finish=True)

    def run(self) -> None:
        while not self._halt.wait(self._interval):
            with self._lock:
                for follow in self._follows:
                    self._drain(follow)
                if not self._broken:
                    self._renderer.tick({id(f): (f.stream, f.prefix) for f in self._follows})

    def close(self) -> None:
        """Copy the rest of every file, complete unfinished lines, and stop."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)
        self.retire()

    def _drain(self, follow: _Follow, finish: bool = False) -> None:
        text = follow.read()
        if self._broken:
            return
        try:
            if text:
                self._renderer.feed(id(follow), follow.stream, follow.prefix, text)
            if finish:
                self._renderer.finish(id(follow), follow.stream, follow.prefix)
        except (OSError, ValueError):
            self._broken = True  # the console went away (a closed pipe): the files still have all
        if finish and follow.handle is not None:
            follow.handle.close()


def _isatty(stream: TextIO) -> bool:
    with contextlib.suppress(AttributeError, ValueError, OSError):
        return stream.isatty()
    return False


def _same_terminal(out: TextIO, err: TextIO) -> bool:
    """Whether stdout and stderr are one screen (then one block of in-place lines serves both)."""
    if not (_isatty(out) and _isatty(err)):
        return False
    try:
        return os.path.samestat(os.fstat(out.fileno()), os.fstat(err.fileno()))
    except (AttributeError, ValueError, OSError):
        return False


def _width(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return shutil.get_terminal_size().columns
