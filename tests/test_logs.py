"""Rank-aware output: setup_logging and progress, in one process and across 2 gloo ranks."""

from __future__ import annotations

import io
import logging
import sys
from typing import Any

import pytest

import unidist
from unidist.session import state as _state
from unidist.testing import run_distributed


@pytest.fixture
def fresh_logger() -> Any:
    """A private logger, so the root logger and pytest's capture stay untouched."""
    logger = logging.getLogger("unidist.tests.logs")
    yield logger
    logger.handlers.clear()


def _as_rank(monkeypatch: pytest.MonkeyPatch, rank: int) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    _state.reset()


def test_main_rank_only_by_default_and_every_rank_on_request(
    monkeypatch: pytest.MonkeyPatch, fresh_logger: logging.Logger
) -> None:
    out = io.StringIO()
    unidist.setup_logging(logger=fresh_logger, stream=out, fmt="[rank %(rank)s] %(message)s")
    _as_rank(monkeypatch, 1)
    fresh_logger.info("from one")
    _as_rank(monkeypatch, 0)  # the rank is read per record: right before and after initialize
    fresh_logger.info("from zero")
    assert out.getvalue() == "[rank 0] from zero\n"
    # A second call replaces the handler instead of adding one (no doubled lines).
    unidist.setup_logging(
        logger=fresh_logger, stream=out, fmt="%(rank)s %(message)s", all_ranks=True
    )
    assert len(fresh_logger.handlers) == 1
    _as_rank(monkeypatch, 1)
    fresh_logger.warning("again")
    assert out.getvalue().endswith("1 again\n")


def test_a_malformed_environment_never_breaks_a_log_call(
    monkeypatch: pytest.MonkeyPatch, fresh_logger: logging.Logger
) -> None:
    out = io.StringIO()
    unidist.setup_logging(logger=fresh_logger, stream=out, fmt="%(rank)s %(message)s")
    monkeypatch.setenv("RANK", "abc")
    monkeypatch.setenv("WORLD_SIZE", "2")
    _state.reset()
    fresh_logger.error("still shown")
    assert out.getvalue() == "? still shown\n"


def test_progress_shows_on_the_main_rank_only(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    assert list(unidist.progress(range(5), desc="epoch", file=out)) == [0, 1, 2, 3, 4]
    assert "epoch" in out.getvalue()
    assert "5/5" in out.getvalue()  # tqdm's bar (tqdm comes with the test environment)
    _as_rank(monkeypatch, 1)
    quiet = io.StringIO()
    assert list(unidist.progress(range(3), desc="epoch", file=quiet)) == [0, 1, 2]
    assert quiet.getvalue() == ""
    assert list(unidist.progress(range(2), desc="e", file=quiet, all_ranks=True)) == [0, 1]
    assert "[rank 1] e" in quiet.getvalue()


def test_progress_without_tqdm_prints_plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # import tqdm.auto now fails
    out = io.StringIO()
    assert list(unidist.progress(iter(range(4)), desc="eval", file=out)) == [0, 1, 2, 3]
    assert out.getvalue() == "eval: 4 done\n"
    out = io.StringIO()
    assert list(unidist.progress(range(3), file=out)) == [0, 1, 2]
    assert out.getvalue() == "progress: 3/3 done\n"


def _log_on_every_rank(all_ranks: bool) -> str:
    out = io.StringIO()
    logger = logging.getLogger("unidist.tests.logs.distributed")
    unidist.setup_logging(
        logger=logger, stream=out, all_ranks=all_ranks, fmt="%(rank)s:%(message)s"
    )
    logger.info("hello from %d", unidist.get_rank())
    return out.getvalue()


@pytest.mark.multiprocess
def test_across_two_gloo_ranks() -> None:
    assert run_distributed(_log_on_every_rank, False) == ["0:hello from 0\n", ""]
    assert run_distributed(_log_on_every_rank, True) == ["0:hello from 0\n", "1:hello from 1\n"]


def _loader_settings_through_the_root_logger() -> str:
    out = io.StringIO()
    unidist.setup_logging(stream=out, fmt="%(rank)s %(name)s %(message)s")
    unidist.auto_dataloader(range(8), global_batch_size=4, num_workers=0)
    return out.getvalue()


@pytest.mark.multiprocess
def test_auto_dataloader_settings_appear_once_on_the_main_rank() -> None:
    main, other = run_distributed(_loader_settings_through_the_root_logger)
    assert main.startswith("0 unidist.data auto_dataloader: range of 8 over 2 rank(s)")
    assert main.count("\n") == 1
    assert other == ""
