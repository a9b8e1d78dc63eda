"""The launchers' failure relay on a real store: first writer wins, a forged record is refused."""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from tests._waiting import wait_for
from tests.launch.helpers import free_port
from unidist.launch import relay
from unidist.launch.relay import Failure, Relay, decode, encode

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


def received(relay_: Relay, timeout: float = 5) -> Failure | None:
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
        started = time.monotonic()
        a.linger()  # a node that only learnt of it leaves as soon as every node has seen it
        assert time.monotonic() - started < 1
        a.publish(replace(RAISED, rank=0, local_rank=0, node_rank=0, host="node-a"))
        time.sleep(relay.POLL * 2)  # two polls for a change that must not come: nothing to await
        assert a.received() == RAISED  # first writer wins: every node reports the same rank
        started = time.monotonic()
        b.linger()  # both have seen it: no waiting
        assert time.monotonic() - started < 1
    finally:
        a.stop()
        b.stop()


def test_a_ranks_own_failure_replaces_a_published_wait(store_port: int) -> None:
    a, b = relays(store_port, 2)
    try:
        a.publish(TIMEOUT)
        assert received(b) == TIMEOUT
        b.publish(RAISED)
        wait_for(lambda: a.received() == RAISED, 5, "rank 1's own failure to replace the wait")
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
        assert time.monotonic() - started <= relay.LINGER + 0.5
        assert lonely.received() is None
        assert lonely.errors >= 1
    finally:
        started = time.monotonic()
        lonely.stop()
        assert time.monotonic() - started < relay.DEADLINE + 1.5


STORE_HOST = """
import sys
from datetime import timedelta
import torch.distributed as dist
server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
print(server.port, flush=True)
sys.stdin.read()
"""


def test_a_stopped_store_host_costs_a_deadline_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    # The launcher that hosts the rendezvous store is stopped (SIGSTOP): torch's client would
    # wait for ever for the answer to an add; the relay's round trips have their own deadline.
    import os
    import signal
    import subprocess
    import sys

    monkeypatch.setattr(relay, "DEADLINE", 1.5)
    monkeypatch.setattr(relay, "LINGER", 2.0)
    with subprocess.Popen(
        [sys.executable, "-c", STORE_HOST],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as host:
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
            assert time.monotonic() - started <= relay.LINGER + relay.DEADLINE + 1.0
            started = time.monotonic()
            one.stop()
            assert time.monotonic() - started < 2 * relay.DEADLINE + 1.5
        finally:
            host.kill()
