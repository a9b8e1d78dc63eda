"""Another local user and a shared ``--log-dir``: the run folder is trusted by its handle.

``--log-dir`` may be a team folder that everyone can write to without the sticky bit: anyone can
rename the launcher's run folder there. The attack is played for real: uid 65534, through
``setpriv``, swaps the run folder of a healthy job (``renameat2`` with ``RENAME_EXCHANGE``) for a
folder of its own that holds forged start records (naming two processes of root's) and forged
progress records (a frame full of terminal escapes, and no progress). The job must finish as if
nothing happened: no hang called, no forged frame printed, no process the forgery names signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._users import NOBODY, as_user, reachable_folder
from tests._waiting import wait_for
from tests.launch.helpers import alive, start_launch

pytestmark = [pytest.mark.multiprocess, pytest.mark.otheruser]

#: A job that makes progress (a collective every 50 ms) until the file it names appears.
JOB = """
import os, sys, time
import unidist
unidist.initialize()
print(f"rank {unidist.get_rank()} started", flush=True)
while not unidist.all_reduce(int(os.path.exists(sys.argv[1])), "max"):
    time.sleep(0.05)
print(f"rank {unidist.get_rank()} done", flush=True)
"""

#: The other user: waits for the go file, plants a folder of forged records beside the run
#: folder and swaps the two; says "swapped".
ATTACKER = r"""
import ctypes, json, os, sys, time
from unidist.hangs import page as record

logs, go, victims = sys.argv[1], sys.argv[2], [int(p) for p in sys.argv[3:]]
while not os.path.exists(go):
    time.sleep(0.02)
run = next(n for n in os.listdir(logs) if not n.startswith("evil"))
evil = os.path.join(logs, "evil")
events = os.path.join(evil, ".events")
os.makedirs(events)
for rank, pid in enumerate(victims):
    start = {"rank": rank, "pid": pid, "pid_start": None, "host": "forged", "start": 0,
             "time_ns": time.time_ns()}
    with open(os.path.join(events, f"start-s0-r{rank}.json"), "w") as out:
        json.dump(start, out)
    writer = record.Writer(os.path.join(events, f"progress-s0-r{rank}.bin"))
    writer.values.update(pid=pid, state=1, beat=time.monotonic_ns(),
                         frame="/x/\x1b]0;owned\x07\x1b[2Jforged.py:1 evil")
    writer.flush()
libc = ctypes.CDLL(None, use_errno=True)
path = lambda name: os.path.join(logs, name).encode()
if libc.renameat2(-100, path(run), -100, path("evil"), 2) != 0:  # RENAME_EXCHANGE
    print("refused", ctypes.get_errno(), flush=True)
else:
    print("swapped", flush=True)
"""


@pytest.fixture
def shared() -> Iterator[Path]:
    """A team folder: under one uid 65534 can reach, writable by all, no sticky bit."""
    with reachable_folder("unidist-shared-") as base:
        logs = base / "logs"
        logs.mkdir()
        logs.chmod(0o777)
        yield logs


def _victims() -> list[subprocess.Popen[bytes]]:
    """Two processes of root's, each the leader of its own session (as a rank is)."""
    return [subprocess.Popen(["sleep", "300"], start_new_session=True) for _ in range(2)]


def test_another_user_swapping_the_run_folder_decides_nothing(shared: Path) -> None:
    script = shared.parent / "job.py"
    script.write_text(JOB)
    stop, go = shared.parent / "stop", shared.parent / "go"
    victims = _victims()
    attacker = subprocess.Popen(
        [
            *as_user(NOBODY),
            sys.executable,
            "-c",
            ATTACKER,
            str(shared),
            str(go),
            *(str(v.pid) for v in victims),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")},
    )
    job = start_launch(
        "-n", "2", "--log-dir", str(shared), "--hang-timeout", "5", str(script), str(stop)
    )
    try:
        assert job.stdout is not None
        for line in job.stdout:  # every rank runs: the launcher holds its folder's handle
            if "rank 1 started" in line or "rank 0 started" in line:
                break
        go.touch()
        assert attacker.stdout is not None
        said = attacker.stdout.readline().strip()
        assert said == "swapped", said
        # Longer than --hang-timeout with forged records that never move: what the attack
        # needs to have a hang called (a wait for something that must not come).
        time.sleep(8)
        stop.touch()
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            out, err = job.communicate()
        attacker.communicate(timeout=30)
    try:
        assert job.returncode == 0, err[-3000:]
        assert "no rank made progress" not in err
        assert "hang was called" not in err
        assert "\x1b" not in out + err
        assert "forged" not in out + err
        assert all(alive(v.pid) for v in victims)  # never signalled: only a file named them
        # The ranks wrote through the launcher's handle: their records are in the real run
        # folder, which is where the attacker's folder was put; the forged folder is untouched.
        real = shared / "evil"
        assert sorted(p.name for p in (real / ".events").glob("done-*")) == [
            "done-s0-r0.json",
            "done-s0-r1.json",
        ]
    finally:
        for victim in victims:
            victim.send_signal(signal.SIGKILL)
            victim.wait()
    wait_for(lambda: not any(alive(v.pid) for v in victims), 10, "the victims' end")
