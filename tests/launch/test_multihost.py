"""One job on two hosts: a rank that fails on one host stops the whole job within seconds.

Each host is a network namespace of its own, with its own address, host name and ``/etc/hosts``
(``ip netns`` and ``unshare``, as root), joined by a veth pair: the launchers reach each other
only over that link, as on two machines. The tests are marked ``netns`` and skip, saying why,
where namespaces cannot be made.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests._waiting import wait_for
from tests.launch.helpers import SCRIPTS, assert_nothing_left, free_port

pytestmark = [pytest.mark.multiprocess, pytest.mark.netns]

FAILING_JOB = str(SCRIPTS / "failing_job.py")
#: An unusual private subnet, so that the test never meets a real network's addresses.
SUBNET = "10.213.77"
_serial = itertools.count()


class Hosts:
    """Two network namespaces, ``node-a`` and ``node-b``, joined by a veth pair."""

    names = ("node-a", "node-b")

    def __init__(self, folder: Path) -> None:
        tag = f"{os.getpid()}x{next(_serial)}"
        self.namespaces = (f"unidist-a{tag}", f"unidist-b{tag}")
        self.links = (f"uda{tag}"[:15], f"udb{tag}"[:15])
        self.addresses = (f"{SUBNET}.1", f"{SUBNET}.2")
        self.hosts_file = folder / "hosts"
        self.hosts_file.write_text(
            "127.0.0.1 localhost\n"
            + "".join(
                f"{addr} {name}\n" for addr, name in zip(self.addresses, self.names, strict=True)
            )
        )

    def create(self) -> None:
        a, b = self.namespaces
        la, lb = self.links
        for command in (
            ["ip", "netns", "add", a],
            ["ip", "netns", "add", b],
            ["ip", "link", "add", la, "type", "veth", "peer", "name", lb],
            ["ip", "link", "set", la, "netns", a],
            ["ip", "link", "set", lb, "netns", b],
            ["ip", "-n", a, "addr", "add", f"{self.addresses[0]}/24", "dev", la],
            ["ip", "-n", b, "addr", "add", f"{self.addresses[1]}/24", "dev", lb],
            ["ip", "-n", a, "link", "set", "lo", "up"],
            ["ip", "-n", b, "link", "set", "lo", "up"],
            ["ip", "-n", a, "link", "set", la, "up"],
            ["ip", "-n", b, "link", "set", lb, "up"],
        ):
            subprocess.run(command, check=True, capture_output=True, timeout=10)

    def remove(self) -> None:
        for namespace in self.namespaces:  # removes the veth pair with it
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", self.links[0]], capture_output=True, timeout=10)

    def launch(self, node: int, *args: str) -> subprocess.Popen[str]:
        """``unidist launch ARGS`` on host ``node`` (0: node-a, 1: node-b), in the background."""
        script = (
            f'hostname {self.names[node]} && mount --bind {self.hosts_file} /etc/hosts && exec "$@"'
        )
        command = [
            *("ip", "netns", "exec", self.namespaces[node]),
            *("unshare", "--uts", "--mount", "sh", "-c", script, "sh"),
            *(sys.executable, "-m", "unidist", "launch", *args),
        ]
        # gloo picks the address the host name resolves to; naming the link makes it explicit.
        env = {**os.environ, "GLOO_SOCKET_IFNAME": self.links[node]}
        return subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    pair = Hosts(tmp_path)
    try:
        pair.create()
        yield pair
    finally:
        pair.remove()


def finish(launchers: list[subprocess.Popen[str]], timeout: float) -> list[tuple[str, str, float]]:
    """Each launcher's stdout, stderr and the time it was seen to exit (``time.time_ns``)."""
    deadline = time.monotonic() + timeout
    ended: dict[int, float] = {}
    try:
        while len(ended) < len(launchers) and time.monotonic() < deadline:
            for i, launcher in enumerate(launchers):
                if i not in ended and launcher.poll() is not None:
                    ended[i] = time.time_ns()
            time.sleep(0.05)
    finally:
        for launcher in launchers:
            launcher.kill()
    outputs = [launcher.communicate(timeout=30) for launcher in launchers]
    assert len(ended) == len(launchers), (f"launchers still running after {timeout} s", outputs)
    return [(out, err, ended[i]) for i, (out, err) in enumerate(outputs)]


def failed_at(log_dir: Path, rank: int) -> int:
    """When ``rank`` recorded its error (``time.time_ns``), from its error file in the run
    folder (torch's format, unidist's details under ``extraInfo.unidist``)."""
    (record,) = log_dir.glob(f"*/.events/error-s0-r{rank}.json")
    return int(json.loads(record.read_text())["message"]["extraInfo"]["unidist"]["time_ns"])


def culprit_line(err: str) -> str:
    summary = err.split("unidist launch: the job failed", 1)[1]
    return next(line for line in summary.splitlines() if "culprit:" in line)


def static_form(hosts: Hosts, port: int, node: int) -> list[str]:
    return [
        "--nnodes",
        "2",
        "--node-rank",
        str(node),
        "--master-addr",
        "node-a",
        "--master-port",
        str(port),
    ]


def c10d_form(hosts: Hosts, port: int, node: int) -> list[str]:
    return [
        "--nnodes",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"node-a:{port}",
        "--rdzv-id",
        "multihost",
    ]


FULL_PRODUCT = pytest.mark.full_product


@pytest.mark.parametrize(
    ("form", "wait"),
    [
        # Each rendezvous and each wait once on the newest torch; every pair on the pinned one.
        pytest.param(static_form, "barrier", id="static-barrier"),
        pytest.param(static_form, "allreduce", id="static-allreduce", marks=FULL_PRODUCT),
        pytest.param(c10d_form, "barrier", id="c10d-barrier", marks=FULL_PRODUCT),
        pytest.param(c10d_form, "allreduce", id="c10d-allreduce"),
    ],
)
def test_a_failure_on_one_host_stops_the_job_on_every_host(
    hosts: Hosts, tmp_path: Path, wait: str, form: Callable[[Hosts, int, int], list[str]]
) -> None:
    port = free_port()
    logs = [tmp_path / "node-a", tmp_path / "node-b"]
    launchers = [
        hosts.launch(
            node,
            *form(hosts, port, node),
            "-n",
            "2",
            "--log-dir",
            str(logs[node]),
            FAILING_JOB,
            wait,
        )
        for node in (0, 1)
    ]
    outputs = finish(launchers, timeout=120)
    codes = [launcher.returncode for launcher in launchers]
    assert codes == [1, 1], outputs
    # The c10d rendezvous may give node-b node rank 0: rank 3 is whichever host got ranks 2-3.
    culprit_host = 1 if list(logs[1].glob("*/.events/error-s0-r3.json")) else 0
    broke = failed_at(logs[culprit_host], 3)
    for node, (_, err, ended) in enumerate(outputs):
        # Within seconds of the failure, not when barrier(timeout=60) or gloo would give up.
        took = (ended - broke) / 1e9
        print(f"{hosts.names[node]}'s launcher exited {took:.1f} s after rank 3 failed")
        assert took < 15, (node, err)
        line = culprit_line(err)
        assert f"rank 3 (local rank 1) on {hosts.names[culprit_host]}" in line, (node, err)
        assert "ValueError: rank 3 is broken" in line, (node, err)
    for folder in logs:
        assert_nothing_left(folder)


def test_a_host_cut_off_from_the_network_is_named_by_the_other(
    hosts: Hosts, tmp_path: Path
) -> None:
    # node-b's link goes down while every rank all-reduces: no connection is reset, so gloo
    # on node-a would wait for its timeout (minutes). node-a's launcher sees node-b's beat
    # stop (torch's keep-alive, here 1 s x 3) and stops the job, naming the host's node.
    port = free_port()
    logs = [tmp_path / "node-a", tmp_path / "node-b"]
    conf = ["--rdzv-conf", "keep_alive_interval=1,keep_alive_max_attempt=3"]
    launchers = [
        hosts.launch(
            node,
            *c10d_form(hosts, port, node),
            *conf,
            "-n",
            "1",
            "--log-dir",
            str(logs[node]),
            FAILING_JOB,
            "steady",
        )
        for node in (0, 1)
    ]
    try:
        wait_for(
            lambda: all(
                any("is up on" in log.read_text() for log in logs[node].glob("*/rank*.stdout.log"))
                for node in (0, 1)
            ),
            120,
            "both hosts' ranks",
        )
        time.sleep(1)  # a few all-reduces across the link
        subprocess.run(
            ["ip", "-n", hosts.namespaces[1], "link", "set", hosts.links[1], "down"],
            check=True,
            capture_output=True,
            timeout=10,
        )
        cut = time.monotonic()
        _, err = launchers[0].communicate(timeout=120)
        took = time.monotonic() - cut
    finally:
        for launcher in launchers:
            launcher.kill()
            launcher.communicate(timeout=30)
    print(f"node-a's launcher exited {took:.1f} s after node-b's link went down")
    assert launchers[0].returncode == 1, err
    # The rendezvous gave node-b node rank 1 or 0; the named node is node-b's, whichever it got.
    node_b = 1 if list(logs[1].glob("*/.events/start-s0-r1.json")) else 0
    line = culprit_line(err)
    assert f"other ranks of node {node_b}: node {node_b} went away" in line, err
    assert took < 30, err
    assert_nothing_left(logs[0])
