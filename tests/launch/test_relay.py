"""The launchers' failure relay on a real store: first writer wins, a forged record is refused."""

from __future__ import annotations

import json
import pickle
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from tests._waiting import join_store_threads, wait_for
from tests.launch.helpers import free_port, start_store_host
from unidist.launch.supervise import relay
from unidist.launch.supervise.notices import Failure, decode, encode
from unidist.launch.supervise.relay import Relay

ROUND = "0-10.0.0.1:1234"
RAISED = Failure(
    rank=3,
    local_rank=1,
    node_rank=1,
    host="node-b",
    kind="raised",
    detail="raised ValueError: rank 3 is broken",
    exit_code=1,
    time_ns=1,
    stdout="/logs/rank3.stdout.log",
    stderr="/logs/rank3.stderr.log",
)
TIMEOUT = replace(RAISED, rank=0, local_rank=0, node_rank=0, host="node-a", kind="timeout")


def test_a_record_survives_the_trip() -> None:
    assert decode(encode(RAISED), world_size=4, nproc=2) == RAISED


@pytest.mark.parametrize(
    "change",
    [
        {"rank": 2},  # not the rank that node 1's local rank 1 has
        {"node_rank": 0},
        {"rank": 7, "node_rank": 3},  # outside the world
        {"rank": True},
        {"kind": "stopped"},
        {"host": "node-b\x1b[2J"},  # a terminal escape
        {"host": ""},
        {"detail": "x" * 10_000},
        {"exit_code": 300},
        {"extra": 1},
    ],
)
def test_a_forged_or_foreign_record_is_refused(change: dict[str, Any]) -> None:
    data = {**json.loads(encode(RAISED)), **change}
    assert decode(json.dumps(data), world_size=4, nproc=2) is None


def test_garbage_is_refused() -> None:
    for raw in (b"", b"[]", b"\xff\xfe", pickle.dumps(RAISED), b"{" * 100_000):
        assert decode(raw, world_size=4, nproc=2) is None


@pytest.fixture
def store_port() -> Iterator[int]:
    import torch.distributed as dist

    port = free_port()
    server = dist.TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5)
    )
    yield port
    del server


def relays(port: int, count: int) -> list[Relay]:
    made = [Relay("127.0.0.1", port, "job") for _ in range(count)]
    for one in made:
        one.round(ROUND, world_size=2 * count, nproc=2)
        one.start()
    return made


#: What a bounded wait may take beyond its deadline on a busy machine (a hang takes minutes).
SLACK = 10.0


def received(relay_: Relay, timeout: float = 60) -> Failure | None:
    """What ``relay_`` received, waiting until it arrives (``timeout``: only a bound; a busy
    machine can take seconds for a store round trip)."""
    deadline = time.monotonic() + timeout
    while relay_.received() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return relay_.received()


def test_every_node_learns_the_culprit_and_the_first_stays(store_port: int) -> None:
    a, b = relays(store_port, 2)
    try:
        b.publish(RAISED)
        assert received(a) == RAISED
        assert received(b) == RAISED
        assert a.linger()  # a node that only learnt of it leaves once every node has seen it
        a.publish(replace(RAISED, rank=0, local_rank=0, node_rank=0, host="node-a"))
        time.sleep(relay.POLL * 2)  # two polls for a change that must not come: nothing to await
        assert a.received() == RAISED  # first writer wins: every node reports the same rank
        assert b.linger()  # both have seen it: not its deadline
    finally:
        a.stop()
        b.stop()


def test_a_ranks_own_failure_replaces_a_published_wait(store_port: int) -> None:
    a, b = relays(store_port, 2)
    try:
        a.publish(TIMEOUT)
        assert received(b) == TIMEOUT
        b.publish(RAISED)
        wait_for(lambda: a.received() == RAISED, 60, "rank 1's own failure to replace the wait")
    finally:
        a.stop()
        b.stop()


def test_a_stranger_cannot_block_the_relay_with_garbage(store_port: int) -> None:
    import torch.distributed as dist

    stranger = dist.TCPStore("127.0.0.1", store_port, is_master=False, wait_for_workers=False)
    stranger.set(f"unidist/launch/job/{ROUND}/failed", pickle.dumps(RAISED))
    a, b = relays(store_port, 2)
    try:
        time.sleep(relay.POLL * 2)  # two polls for a belief that must not come: nothing to await
        assert a.received() is None  # never believed
        b.publish(RAISED)
        assert received(a) == RAISED
    finally:
        a.stop()
        b.stop()


def test_a_vanished_store_costs_a_deadline_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay, "DEADLINE", 0.5)
    monkeypatch.setattr(relay, "LINGER", 1.0)
    lonely = Relay("127.0.0.1", free_port(), "job")
    lonely.round(ROUND, world_size=4, nproc=2)
    lonely.start()
    try:
        lonely.publish(RAISED)
        started = time.monotonic()
        lonely.linger()
        assert time.monotonic() - started <= relay.LINGER + SLACK
        assert lonely.received() is None
        assert lonely.errors >= 1
    finally:
        started = time.monotonic()
        lonely.stop()
        assert time.monotonic() - started < relay.DEADLINE + SLACK


def test_a_stopped_store_host_costs_a_deadline_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    # The launcher that hosts the rendezvous store is stopped (SIGSTOP): torch's client would
    # wait for ever for the answer to an add; the relay's round trips have their own deadline.
    import os
    import signal

    monkeypatch.setattr(relay, "DEADLINE", 1.5)
    monkeypatch.setattr(relay, "LINGER", 2.0)
    with start_store_host() as host:
        try:
            assert host.stdout is not None
            port = int(host.stdout.readline())
            one, other = relays(port, 2)
            one.publish(RAISED)
            assert received(other, 30) == RAISED  # the store answered while it ran
            other.stop()
            os.kill(host.pid, signal.SIGSTOP)
            started = time.monotonic()
            one.linger()  # waits for the other node to see it, through the stopped store
            assert time.monotonic() - started <= relay.LINGER + relay.DEADLINE + SLACK
            started = time.monotonic()
            one.stop()
            assert time.monotonic() - started < 2 * relay.DEADLINE + SLACK
        finally:
            host.kill()
            join_store_threads(4 * relay.DEADLINE)  # stop() bounds its wait, not the thread


# -- lost nodes: a launcher that dies with its ranks says nothing; its beat stops ---------------


def test_the_watched_beat_counts_silence_on_the_watchers_own_clock() -> None:
    watch = relay._Watch(me=2, nodes=4, now=100.0)
    assert watch.node == 3  # the next node, wrapping round
    assert watch.silent(5, 100.0) == 0
    assert watch.silent(5, 100.5) == 0.5
    assert watch.silent(6, 101.0) == 0  # it moved
    assert watch.silent(6, 101.5) == 0.5
    # The watcher itself was held up for a minute: it starts counting again, not blaming node 3.
    assert watch.silent(6, 161.5) == 0
    # A node not seen beating yet in the round (it may start later): twice as long.
    assert watch.silent(0, 162.5) == 0
    assert watch.silent(0, 164.5) == 1.0
    watch.skip()
    assert watch.node == 0
    watch.skip()
    watch.skip()
    assert watch.node == 2  # every other node left: it watches itself, which means nothing


LONE_RELAY = """
import sys, time
from unidist.launch.supervise.relay import Relay
one = Relay("127.0.0.1", int(sys.argv[1]), "job")
one.round(sys.argv[2], world_size=4, nproc=2, node_rank=1)
one.start()
print("beating", flush=True)
time.sleep(600)
"""


@pytest.mark.multiprocess
def test_a_node_whose_launcher_dies_is_published_as_lost(store_port: int) -> None:
    import subprocess
    import sys

    a = Relay("127.0.0.1", store_port, "job", lost=3.0)
    a.round(ROUND, world_size=4, nproc=2, node_rank=0)
    other = subprocess.Popen(
        [sys.executable, "-c", LONE_RELAY, str(store_port), ROUND],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout is not None
        assert other.stdout.readline() == "beating\n"
        a.start()  # after the other's start-up, which can take seconds on a loaded machine
        time.sleep(a.lost + 1)  # alive and beating: never taken for lost
        assert a.received() is None
        other.kill()  # SIGKILL: it says nothing
        killed = time.monotonic()
        found = received(a)
        assert found is not None
        assert (found.kind, found.rank, found.node_rank) == ("lost", 2, 1)
        assert "node 1 went away" in found.detail
        assert "node 0" in found.detail
        assert time.monotonic() - killed < a.lost + SLACK
    finally:
        other.kill()
        other.communicate()
        a.stop()


def test_a_node_that_leaves_or_moves_on_is_not_lost(store_port: int) -> None:
    a, b, c = (Relay("127.0.0.1", store_port, "job", lost=1.5) for _ in range(3))
    for node, one in enumerate((a, b, c)):
        one.round(ROUND, world_size=6, nproc=2, node_rank=node)
        one.start()
    try:
        time.sleep(1)
        b.stop()  # node 1 is done: node 0 watches node 2 from now on
        c.round("1-10.0.0.1:1234", world_size=6, nproc=2, node_rank=2)  # node 2: a new round
        time.sleep(a.lost + 2)
        assert a.received() is None
    finally:
        for one in (a, b, c):
            one.stop()


def test_a_node_renumbered_by_the_next_round_leaves_under_its_old_number(store_port: int) -> None:
    # The c10d rendezvous may give a launcher another node rank in the next round: the "left"
    # mark of the old round must go to the number it beat under there, or a watcher still in
    # the old round would take it for lost.
    a, b = (Relay("127.0.0.1", store_port, "job", lost=1.5) for _ in range(2))
    a.round(ROUND, world_size=4, nproc=2, node_rank=0)
    b.round(ROUND, world_size=4, nproc=2, node_rank=1)
    for one in (a, b):
        one.start()
    try:
        time.sleep(1)
        b.round("1-10.0.0.1:1234", world_size=4, nproc=2, node_rank=0)
        time.sleep(a.lost + 2)
        assert a.received() is None
    finally:
        a.stop()
        b.stop()


def test_a_node_whose_ranks_finished_leaves_the_round_and_asks_the_store_nothing_more(
    store_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The end of a job: the store's host leaves after torch's exit barrier, and a round trip
    # of a node still following the round would meet a vanishing store (torch's client then
    # prints a C++ warning with its stack).
    import torch.distributed as dist

    a, b = (Relay("127.0.0.1", store_port, "job", lost=1.5) for _ in range(2))
    for node, one in enumerate((a, b)):
        one.round(ROUND, world_size=4, nproc=2, node_rank=node)
        one.start()
    try:
        time.sleep(relay.POLL * 2)  # both beat
        left = threading.Event()
        b.leave(left.set)
        assert left.wait(5)
        calls: list[str] = []
        original = b._call
        monkeypatch.setattr(b, "_call", lambda op: calls.append("call") or original(op))
        time.sleep(a.lost + 2)  # b is not taken for lost: its beat says it left
        assert a.received() is None
        assert calls == []
        viewer = dist.TCPStore("127.0.0.1", store_port, is_master=False, wait_for_workers=False)
        assert viewer.add(f"unidist/launch/job/{ROUND}/seen", 0) == 1  # counted as if it saw
        assert viewer.add(f"unidist/launch/job/{ROUND}/beat/1", 0) >= relay._LEFT
        # A node that fails now lingers for the nodes still in the round only (itself).
        monkeypatch.setattr(relay, "LINGER", 60.0)
        a.publish(replace(RAISED, rank=1, local_rank=1, node_rank=0, host="node-a"))
        assert received(a) is not None
        assert a.linger()  # not the 60 s of waiting for b's word
        assert calls == []
        again = threading.Event()
        b.leave(again.set)  # asked twice: answered at once, still without a round trip
        assert again.wait(1)
        assert calls == []
    finally:
        a.stop()
        b.stop()


def test_leaving_without_a_round_answers_at_once() -> None:
    lone = Relay("127.0.0.1", 9, "job")  # never started, never connected
    left = threading.Event()
    lone.leave(left.set)
    assert left.is_set()
