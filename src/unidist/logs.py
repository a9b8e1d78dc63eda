"""Rank-aware output: log records tagged with the rank, from the main rank only by default.

* :func:`setup_logging` adds one handler to a logger (the root logger by default) whose records
  carry ``%(rank)s`` and which shows the main rank's records only, or every rank's on request.
  Ignite's ``setup_logger(distributed_rank=...)`` does the same for one named logger; unidist's
  decides per record, so it is right before and after :func:`unidist.initialize` alike.
* :func:`progress` is a progress bar over an iterable on the main rank (tqdm when installed,
  a line every few seconds otherwise); the other ranks iterate without one.

Under ``unidist launch`` every rank's output is also prefixed by the launcher; these helpers are
about what a rank chooses to say, and work the same under any launcher or none.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any, TypeVar

from unidist import ranks

__all__ = ["RankFilter", "progress", "setup_logging"]

T = TypeVar("T")

#: The default format: time, rank, logger, level, message.
FORMAT = "%(asctime)s [rank %(rank)s] %(name)s %(levelname)s: %(message)s"
#: Seconds between two lines of the plain progress display (no tqdm).
_PLAIN_EVERY = 5.0


class RankFilter(logging.Filter):
    """Adds ``record.rank``; passes the main rank's records, or every rank's with ``all_ranks``.

    The rank is read for each record (a cheap lookup), so a handler set up before
    :func:`unidist.initialize` is right afterwards too.
    """

    def __init__(self, all_ranks: bool = False) -> None:
        super().__init__()
        self.all_ranks = all_ranks

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            rank = ranks.get_rank()
        except Exception:  # a log call must never raise: an unreadable environment shows "?"
            record.rank = "?"
            return True
        record.rank = rank
        return self.all_ranks or rank == 0


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`setup_logging` installs (recognised, so a second call replaces it)."""


def setup_logging(
    level: int | str = logging.INFO,
    *,
    all_ranks: bool = False,
    logger: str | logging.Logger | None = None,
    stream: IO[str] | None = None,
    fmt: str = FORMAT,
) -> logging.Logger:
    """Show log records with their rank: the main rank's by default, every rank's on request.

    Adds a handler to ``logger`` (default: the root logger, so unidist's own loggers and yours
    show through it) and sets its level. Calling it again replaces the handler it added, so it
    is safe to call from code that may run twice.

    Args:
        level: the logger's level (``logging.INFO``, ``"DEBUG"``, ...).
        all_ranks: show records from every rank, not only the main one (rank 0).
        logger: the logger or its name (default: the root logger).
        stream: where records go (default: ``sys.stderr``).
        fmt: a ``logging`` format; ``%(rank)s`` is the global rank.

    Returns:
        The logger configured.
    """
    target = logger if isinstance(logger, logging.Logger) else logging.getLogger(logger)
    for handler in list(target.handlers):
        if isinstance(handler, _Handler):
            target.removeHandler(handler)
    handler = _Handler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    handler.addFilter(RankFilter(all_ranks))
    target.addHandler(handler)
    target.setLevel(level)
    return target


def progress(
    iterable: Iterable[T],
    *,
    desc: str | None = None,
    total: int | None = None,
    all_ranks: bool = False,
    file: IO[str] | None = None,
    **tqdm_kw: Any,
) -> Iterator[T]:
    """Iterate with a progress bar on the main rank; other ranks iterate without one.

    With tqdm installed the bar is ``tqdm(iterable, ...)``; without it, a plain line
    (``desc: 40/100``) is written at most every few seconds and at the end.

    Args:
        iterable: what to iterate (a DataLoader, a range, ...).
        desc: a label in front of the bar.
        total: the number of items, if ``len(iterable)`` does not say.
        all_ranks: show a bar on every rank (each labelled with its rank).
        file: where the bar goes (default: ``sys.stderr``).
        **tqdm_kw: more tqdm options (ignored without tqdm).

    Returns:
        An iterator over ``iterable``'s items.
    """
    rank = ranks.get_rank()
    if not all_ranks and rank != 0:
        return iter(iterable)
    if all_ranks:
        desc = f"[rank {rank}] {desc}" if desc else f"[rank {rank}]"
    if total is None:
        total = _length(iterable)
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _plain(iterable, desc or "progress", total, file or sys.stderr)
    return iter(tqdm(iterable, desc=desc, total=total, file=file, **tqdm_kw))


def _length(iterable: Iterable[Any]) -> int | None:
    try:
        return len(iterable)  # type: ignore[arg-type]
    except TypeError:
        return None


def _plain(iterable: Iterable[T], desc: str, total: int | None, out: IO[str]) -> Iterator[T]:
    of = f"/{total}" if total is not None else ""
    shown = time.monotonic()
    count = 0
    for count, item in enumerate(iterable, 1):
        yield item
        if time.monotonic() - shown >= _PLAIN_EVERY:
            out.write(f"{desc}: {count}{of}\n")
            out.flush()
            shown = time.monotonic()
    out.write(f"{desc}: {count}{of} done\n")
    out.flush()
