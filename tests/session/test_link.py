"""Every round trip to the control store has a deadline: a stopped host is named, not waited for.

torch's ``TCPStore`` client bounds its waits but not its other round trips (an ``add`` to a
stopped server blocks for ever, whatever ``set_timeout`` says; so does connecting). These tests
stop the host with ``SIGSTOP``, on every torch the matrix runs, and check that every other rank
hears of it within its own timeout plus :data:`~unidist.session.link.UNANSWERED_BOUND`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import unidist
from tests._waiting import join_store_threads, stop, wait_for, wait_stopped
from unidist.errors import DistributedTimeoutError
from unidist.session import listen
from unidist.session.control import ControlPlane
from unidist.session.link import UNANSWERED_BOUND, connect_within
from unidist.session.wire import new_secret
from unidist.testing import run_distributed

SRC = Path(__file__).resolve().parents[2] / "src"
#: Slack for a loaded machine, on top of the promised bound.
SLACK = 3.0
HOST = """
import sys
from datetime import timedelta
from unidist.session import listen
link, address = listen.serve(listen.LOOPBACK, timedelta(seconds=60))
print(link.store.port, flush=True)
sys.stdin.read()  # until the test closes it
"""


@pytest.fixture
def host() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A process that serves a control store, as rank 0 does; the test may stop it."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    child = subprocess.Popen(
        [sys.executable, "-c", HOST],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None
    port = int(child.stdout.readline())
    try:
        yield child, port
    finally:
        child.kill()  # also a stopped one
        child.communicate(timeout=10)  # reaps it and closes the pipes
        join_store_threads(10)


def in_threads(planes: list[ControlPlane], body: Any) -> list[Any]:
    results: dict[int, Any] = {}

    def one(index: int) -> None:
        try:
            results[index] = body(planes[index])
        except BaseException as exc:  # the test looks at it
            results[index] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(planes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads), "a rank still waits"
    return [results[i] for i in range(len(planes))]


@pytest.mark.parametrize("when", ["before they arrive", "while they wait"])
def test_a_stopped_store_host_is_named_within_the_timeout_plus_a_bound(
    host: tuple[subprocess.Popen[str], int], when: str
) -> None:
    child, port = host
    secret = new_secret()
    # Ranks 1 and 2 of three; rank 0 is the host, which never arrives.
    planes = [
        ControlPlane(listen.connect("127.0.0.1", port, timedelta(seconds=30)), rank, secret)
        for rank in (1, 2)
    ]
    seconds = 1.0
    if when == "before they arrive":
        stop(child.pid)
    else:  # stop it once both have arrived and wait for the outcome
        threading.Timer(0.3, os.kill, (child.pid, signal.SIGSTOP)).start()
    started = time.monotonic()
    results = in_threads(planes, lambda plane: plane.barrier((0, 1, 2), seconds, "barrier"))
    took = time.monotonic() - started
    for result in results:
        assert isinstance(result, DistributedTimeoutError), result
        assert f"rank 0 at 127.0.0.1:{port}, which hosts unidist's control store" in str(result)
        assert "did not answer" in str(result)
    assert took < seconds + UNANSWERED_BOUND + SLACK
    # The link is out of step now: the next call fails at once, with the same message.
    again = time.monotonic()
    with pytest.raises(DistributedTimeoutError, match="did not answer"):
        planes[0].agree((0, 1, 2), 1, lambda values: 0, 30, "vote")
    assert time.monotonic() - again < 0.5


def test_connecting_to_a_stopped_store_host_fails_within_the_timeout(
    host: tuple[subprocess.Popen[str], int],
) -> None:
    child, port = host
    stop(child.pid)  # it accepts connections (the kernel does), never answers
    started = time.monotonic()
    with pytest.raises(DistributedTimeoutError, match=f"rank 0 at 127.0.0.1:{port} did not answer"):
        listen.connect("127.0.0.1", port, timedelta(seconds=1))
    assert time.monotonic() - started < 1 + UNANSWERED_BOUND + SLACK


def stop_rank_zero(seconds: float) -> Any:
    """Rank 0 (the store host) stops itself; rank 1 waits at a timed barrier, then resumes it."""
    rank = unidist.get_rank()
    pids = unidist.all_gather_object(os.getpid())
    if rank == 0:
        os.kill(os.getpid(), signal.SIGSTOP)
        return "resumed"
    wait_stopped(pids[0], "rank 0")
    started = time.monotonic()
    try:
        unidist.barrier(timeout=seconds)
        outcome = "passed"
    except DistributedTimeoutError as exc:
        outcome = str(exc)
    took = time.monotonic() - started
    os.kill(pids[0], signal.SIGCONT)
    return outcome, took


@pytest.mark.multiprocess
def test_a_rank_waiting_for_a_stopped_rank_zero_names_it_in_real_processes() -> None:
    seconds = 2.0
    results = run_distributed(stop_rank_zero, seconds, timeout=90)
    outcome, took = results[1]
    assert "which hosts unidist's control store, did not answer" in outcome
    assert "rank 0 at 127.0.0.1:" in outcome
    assert took < seconds + UNANSWERED_BOUND + SLACK
    assert results[0] == "resumed"


def test_a_link_tells_a_store_that_closed_the_connection_without_asking_it(
    host: tuple[subprocess.Popen[str], int],
) -> None:
    child, port = host
    link = connect_within("127.0.0.1", port, timedelta(seconds=30), "the test's store")
    link.store.set("key", "value")  # a round trip leaves nothing to read behind
    assert not link.closed_by_peer()
    assert bytes(link.store.get("key")) == b"value"
    child.kill()
    child.wait(timeout=10)
    wait_for(link.closed_by_peer, 10, "the link to see its store's host gone")
    link.close()
    assert not link.closed_by_peer()  # no connection left to ask: never a false "closed"
