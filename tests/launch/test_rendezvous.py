"""torchrun's rendezvous forms under ``unidist launch``: c10d without node ranks, elastic growth."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests._waiting import wait_for
from tests.launch.helpers import (
    JOB,
    assert_nothing_left,
    c10d,
    free_port,
    pids_of,
    printed,
    run_folder,
    run_folders,
    start_launch,
    start_store_host,
)

pytestmark = pytest.mark.multiprocess


def finish(nodes: list[subprocess.Popen[str]], timeout: float = 180) -> list[tuple[str, str]]:
    try:
        return [node.communicate(timeout=timeout) for node in nodes]
    finally:
        for node in nodes:
            node.kill()


def test_two_launchers_meet_at_a_c10d_endpoint_without_node_ranks(tmp_path: Path) -> None:
    port = free_port()
    nodes = [
        start_launch(*c10d(port, "2", tmp_path / f"node{i}"), "-n", "1", JOB, "ok") for i in (0, 1)
    ]
    outputs = finish(nodes)
    assert [node.returncode for node in nodes] == [0, 0], outputs
    said = "".join(out for out, _ in outputs)
    # One job of two nodes: the rendezvous gave the launchers node ranks 0 and 1.
    assert "rank 0 of 2 on node 0 NODE_RANK=0" in said
    assert "rank 1 of 2 on node 1 NODE_RANK=1" in said
    assert [out.count("total 3.0") for out, _ in outputs] == [1, 1]
    for i in (0, 1):
        assert_nothing_left(tmp_path / f"node{i}")
    assert_no_store_warnings(outputs)


def assert_no_store_warnings(outputs: list[tuple[str, str]]) -> None:
    """No launcher printed torch's C++ store warning ("[c10d] recvValue failed ... got 0 bytes"
    or "Connection reset by peer", then a C++ stack) of its own: the store's host leaves first
    at the end of a job, and the relay, still asking it through torch's client, made every
    launcher print one. A launcher whose ranks finished now leaves the relay's round before its
    last rank exits, so before the host can leave.

    torch's own exit barrier has the same race (pytorch#69520, open): when the last node to
    reach it is not the store's host, the host may leave before that node's ``wait`` reaches
    it, and torch's agent logs "Error waiting on exit barrier" after the C++ warning. torchrun
    does it too (1 of 12 two-node runs under load here), so a warning that comes with that
    line is torch's, not unidist's.

    torch's c10d rendezvous has another: its keep-alive thread writes the rendezvous state with
    ``compare_set`` every ``keep_alive_interval`` (2 s under unidist launch's default
    ``--node-timeout 6``) until the agent shuts the handler down, so a beat in flight when the
    host leaves prints the warning with ``TCPStore::compareSet`` in its stack. The relay uses
    ``compare_set`` only for failures and hangs, never in a job that succeeds, so in these
    jobs such a warning is torch's heartbeat. (Waiting, on the host, for every node's handler
    to shut down before the store goes would end both; not done yet.)"""
    for out, err in outputs:
        warnings = err.count("TCPStore.cpp") + out.count("TCPStore.cpp")
        torchs = err.count("Error waiting on exit barrier") + err.count("TCPStore::compareSet")
        assert warnings <= torchs, err


def test_two_launchers_of_a_static_rendezvous_end_without_store_warnings(tmp_path: Path) -> None:
    port = str(free_port())
    static = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", port, "-n", "1"]
    nodes = [
        start_launch(
            *static, "--node-rank", str(i), "--log-dir", str(tmp_path / f"n{i}"), JOB, "ok"
        )
        for i in (0, 1)
    ]
    outputs = finish(nodes)
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert [out.count("total 3.0") for out, _ in outputs] == [1, 1]
    for i in (0, 1):
        assert_nothing_left(tmp_path / f"n{i}")
    assert_no_store_warnings(outputs)


def test_an_elastic_job_takes_in_a_node_that_joins_later(tmp_path: Path) -> None:
    port = free_port()
    # last_call_timeout: how long the rendezvous waits for more nodes once MIN have joined.
    args = c10d(port, "1:2", tmp_path / "first", "--rdzv-conf", "last_call_timeout=1")
    first = start_launch(*args, "-n", "1", JOB, "grow")
    starts = tmp_path / "first"
    # Its rank has started its script alone (its start record comes before the script's first
    # line: a node that joined in between would restart it before it said so).
    wait_for(
        lambda: any(
            "rank 0 of 1 on node 0" in log.read_text()
            for log in starts.glob("*/attempt0/rank0.stdout.log")
        ),
        120,
        "the first node's rank to start alone",
    )
    args = c10d(port, "1:2", tmp_path / "second", "--rdzv-conf", "last_call_timeout=1")
    second = start_launch(*args, "-n", "1", JOB, "grow")
    outputs = finish([first, second])
    assert [first.returncode, second.returncode] == [0, 0], outputs
    alone = run_folder(tmp_path / "first") / "attempt0" / "rank0.stdout.log"
    assert "rank 0 of 1 on node 0" in alone.read_text()  # it started alone ...
    together = "".join(out for out, _ in outputs)
    assert "of 2 on node 0" in together  # ... and was restarted with the new membership
    assert "of 2 on node 1" in together
    assert together.count("total 3.0") == 2
    assert_nothing_left(tmp_path / "first")
    assert_nothing_left(tmp_path / "second")


def test_a_node_that_dies_with_its_launcher_is_named_within_seconds(tmp_path: Path) -> None:
    # Node B's host goes down (its launcher SIGKILLed, its rank with it): nothing reports it, and
    # node A's rank waits for B's rank in a store barrier (300 s), not in a collective whose
    # socket would close. A's launcher notices that B stopped beating, in torch's keep-alive
    # time (here 1 s x 3), and stops the job naming the node. The store lives in a third
    # process, so either launcher can be the one that dies.
    with start_store_host() as store:
        assert store.stdout is not None
        port = int(store.stdout.readline())
        conf = ["--rdzv-conf", "is_host=false,keep_alive_interval=1,keep_alive_max_attempt=3"]
        nodes = [
            start_launch(
                *c10d(port, "2", tmp_path / f"node{i}", *conf), "-n", "1", JOB, "storewait"
            )
            for i in (0, 1)
        ]
        try:
            wait_for(
                lambda: (
                    all(run_folders(tmp_path / f"node{i}") for i in (0, 1))
                    and all(pids_of(tmp_path / f"node{i}") for i in (0, 1))
                ),
                120,
                "both nodes' ranks",
            )
            holds_rank_1 = [
                bool(list((tmp_path / f"node{i}").glob("*/.events/start-*-r1.json")))
                for i in (0, 1)
            ]
            dies, lives = (nodes[0], nodes[1]) if holds_rank_1[0] else (nodes[1], nodes[0])
            wait_for(lambda: printed(tmp_path / f"node{nodes.index(lives)}", 0), 60, "rank 0")
            dies.kill()
            killed = time.monotonic()
            _, err = lives.communicate(timeout=120)
            took = time.monotonic() - killed
        finally:
            for node in nodes:
                node.kill()
                node.communicate()
            store.kill()
    assert lives.returncode != 0
    summary = err[err.find("unidist launch:") :]
    print(summary)
    assert "culprit: rank 1 and the other ranks of node 1: node 1 went away" in summary, summary
    assert took < 60, f"the job took {took:.0f} s to stop; its barrier's timeout is 300 s"
    assert_nothing_left(tmp_path / f"node{nodes.index(lives)}")


def test_a_rendezvous_host_that_leaves_ends_the_other_node_with_one_line(tmp_path: Path) -> None:
    # The store of a c10d rendezvous lives in the launcher on the --rdzv-endpoint host. When
    # that node goes (its launcher SIGKILLed, its ranks with it), torch's agent on the other
    # node raised RendezvousConnectionError through unidist launch as a raw traceback. Now: one
    # "unidist launch:" line that names the endpoint and what to do.
    port = free_port()
    elastic = ["--rdzv-conf", "last_call_timeout=1", "-n", "1"]
    host = start_launch(*c10d(port, "1:2", tmp_path / "host", *elastic), JOB, "wait")
    first = tmp_path / "host"
    wait_for(lambda: list(first.glob("*/.events/start-s0-r0.json")), 120, "the host's rank")
    other = start_launch(*c10d(port, "1:2", tmp_path / "other", *elastic), JOB, "wait")
    try:
        logs = tmp_path / "other"
        # Either node may get rank 0: torch's rendezvous orders the nodes by address, then by
        # launcher pid, and pids wrap (the joined node was rank 0 in a load run of the suite).
        wait_for(
            lambda: any(
                " of 2 on node " in p.read_text() for p in logs.glob("**/rank*.stdout.log")
            ),
            120,
            "the joined node's rank",
        )
        host.kill()
        host.communicate(timeout=30)
        _, err = other.communicate(timeout=120)
    finally:
        for node in (host, other):
            node.kill()
            node.communicate(timeout=30)
    assert other.returncode == 1, err[-3000:]
    summary = [line for line in err.splitlines() if line.startswith("unidist launch:")]
    assert len(summary) == 1, err[-3000:]
    assert f"lost the c10d rendezvous store at 127.0.0.1:{port}" in summary[0]
    assert "Traceback" not in err.replace("[", "\n[").split("unidist launch:")[-1]
    assert "HINT: keep the node that hosts the store" in err
    assert_nothing_left(tmp_path / "other")
