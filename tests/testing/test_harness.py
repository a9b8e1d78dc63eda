"""unidist.testing.run_distributed: results, failures, timeouts, no process left behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

import unidist
from tests._waiting import wait_for
from unidist.errors import ConfigurationError
from unidist.testing import (
    DistributedTestError,
    DistributedTestHang,
    DistributedTestTimeout,
    run_distributed,
)

pytestmark = pytest.mark.multiprocess


def report(tag: str) -> tuple[str, int, int, float, str]:
    total = unidist.all_reduce(torch.tensor([float(unidist.get_rank() + 1)])).item()
    print(f"hello from {unidist.get_rank()}")
    return tag, unidist.get_rank(), unidist.get_world_size(), total, unidist.backend() or ""


def test_returns_every_ranks_result_in_rank_order(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_distributed(report, "x") == [("x", 0, 2, 3.0, "gloo"), ("x", 1, 2, 3.0, "gloo")]
    out = capsys.readouterr().out
    assert "[rank 0] hello from 0" in out
    assert "[rank 1] hello from 1" in out


def test_three_ranks() -> None:
    assert [r[1:4] for r in run_distributed(report, "y", world_size=3)] == [
        (0, 3, 6.0),
        (1, 3, 6.0),
        (2, 3, 6.0),
    ]


def fail_on(bad_rank: int) -> None:
    if unidist.get_rank() == bad_rank:
        raise ValueError(f"rank {bad_rank} is broken")
    unidist.barrier()  # the healthy rank waits for the broken one


def test_a_failing_rank_raises_with_every_ranks_traceback() -> None:
    started = time.monotonic()
    with pytest.raises(DistributedTestError) as caught:
        run_distributed(fail_on, 1, timeout=60)
    assert time.monotonic() - started < 30, "the healthy rank should fail fast, not time out"
    message = str(caught.value)
    assert "--- rank 1 raised ---" in message
    assert "ValueError: rank 1 is broken" in message
    assert "--- rank 0 raised ---" in message  # collateral: its peer went away
    assert set(caught.value.failures) == {0, 1}
    assert not isinstance(caught.value, DistributedTestTimeout)


def crash_in_native_code() -> None:
    unidist.all_reduce(torch.ones(1000))  # gloo's threads are up, and enter Python now and then
    if unidist.get_rank() == 1:
        import faulthandler

        faulthandler._sigsegv()  # type: ignore[attr-defined]  # CPython's own crash, for tests
    unidist.barrier()


def test_a_rank_that_crashes_in_native_code_shows_where_it_was() -> None:
    with pytest.raises(DistributedTestError) as caught:
        run_distributed(crash_in_native_code, timeout=60)
    message = str(caught.value)
    assert "exited with code -11" in message
    assert "Fatal Python error: Segmentation fault" in message
    assert "in crash_in_native_code" in message  # the crashing thread's stack, written in full


def write_pid_and_hang(directory: str) -> None:
    Path(directory, f"rank{unidist.get_rank()}.pid").write_text(str(os.getpid()))
    if unidist.get_rank() == 1:
        child = subprocess.Popen(["sleep", "300"])  # a grandchild, like a DataLoader worker
        Path(directory, "grandchild.pid").write_text(str(child.pid))
        time.sleep(300)


def test_timeout_kills_every_rank_and_names_the_stuck_ones(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(DistributedTestTimeout) as caught:
        run_distributed(write_pid_and_hang, str(tmp_path), timeout=8)
    # The rank hangs for 300 s: returning long before that shows it was killed (not how fast,
    # which depends on the machine's load).
    assert time.monotonic() - started < 150
    assert caught.value.unfinished == [1]
    message = str(caught.value)
    assert "rank(s) [1] of 2 had not finished" in message
    assert "write_pid_and_hang" in message  # the stuck rank's stack, dumped before the kill
    pids = {name: int((tmp_path / name).read_text()) for name in ("rank0.pid", "rank1.pid")}
    pids["grandchild.pid"] = int((tmp_path / "grandchild.pid").read_text())
    wait_for(
        lambda: not any(_alive(pid) for pid in pids.values()),
        10,
        f"the ranks and the grandchild {pids} to be gone after the timeout",
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split()[2] != "Z"


def test_refuses_functions_it_cannot_send() -> None:
    with pytest.raises(ConfigurationError, match="define the function at module level"):
        run_distributed(lambda: 1)


def environment_seen() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in ("EXTRA", "LOCAL_WORLD_SIZE", "RANK")}


def test_environment_overrides_and_unsets() -> None:
    seen = run_distributed(
        environment_seen, env={"EXTRA": "1", "LOCAL_WORLD_SIZE": None}, init=False
    )
    assert seen == [{"EXTRA": "1", "LOCAL_WORLD_SIZE": None, "RANK": str(r)} for r in (0, 1)]


def unpicklable_result() -> object:
    return lambda: None


def test_an_unpicklable_result_is_reported() -> None:
    with pytest.raises(DistributedTestError, match="return value cannot be pickled"):
        run_distributed(unpicklable_result, init=False)


def no_run_folders(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith("unidist-run-")]


def test_no_temp_folder_is_left_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run_distributed(report, "z")
    with pytest.raises(DistributedTestError):
        run_distributed(fail_on, 1, timeout=60)
    assert no_run_folders(tmp_path) == []


CALLER = """
import os, sys, time
from pathlib import Path
import unidist
from unidist.testing import run_distributed

def hang(folder):
    # Written aside, then renamed: the test globs for rank*.pids while this rank runs.
    aside = Path(folder, f"rank{unidist.get_rank()}.pids.aside")
    aside.write_text(f"{os.getpid()} {os.getppid()}")
    aside.replace(Path(folder, f"rank{unidist.get_rank()}.pids"))
    time.sleep(300)

if __name__ == "__main__":
    run_distributed(hang, sys.argv[1], timeout=250)
"""


def test_a_killed_caller_takes_its_ranks_fork_server_and_folder_along(tmp_path: Path) -> None:
    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    # A short TMPDIR of its own: the fork server's socket lives there, and a socket path over
    # 107 bytes fails (tmp_path is that long under pytest-xdist: ".../popen-gw1/...").
    temp = Path(tempfile.mkdtemp(prefix="udh-"))
    try:
        _kill_the_caller_and_check(script, tmp_path, temp)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _kill_the_caller_and_check(script: Path, folder: Path, temp: Path) -> None:
    env = {**os.environ, "TMPDIR": str(temp), "UNIDIST_TESTING_PRELOAD": "torch"}
    caller = subprocess.Popen([sys.executable, str(script), str(folder)], env=env)
    try:
        deadline = time.monotonic() + 120
        while len(list(folder.glob("rank*.pids"))) < 2:
            assert caller.poll() is None, f"the caller exited with {caller.returncode}"
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.1)
        assert no_run_folders(temp)
    finally:
        caller.kill()  # SIGKILL: no finally, no atexit in the caller
        caller.wait()
    pids = {int(p) for f in folder.glob("rank*.pids") for p in f.read_text().split()}
    deadline = time.monotonic() + 15
    while [pid for pid in pids if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in pids if _alive(pid)] == [], "ranks or the fork server survived"
    assert no_run_folders(temp) == []


# -- hangs: named within seconds, as unidist launch names them -----------------------------------


def slow_step() -> None:
    time.sleep(300)  # the stuck line


def stuck_in_user_code(mode: str) -> None:
    import torch

    for step in range(50):
        if unidist.get_rank() == 1 and step == 3:
            if mode == "sleep":
                slow_step()
            if mode == "sigstop":
                time.sleep(0.5)  # a look of the progress sampler lands here
                os.kill(os.getpid(), signal.SIGSTOP)
        tensor = torch.ones(2)
        if mode == "diverge" and step == 3 and unidist.get_rank() == 1:
            unidist.broadcast(tensor, src=0)
        else:
            unidist.all_reduce(tensor)
        if mode == "straggler":
            time.sleep(0.1 if unidist.get_rank() == 1 else 0.02)


def _line(text: str) -> int:
    source = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(source, 1) if text in line)


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("sleep", f"rank 1 is in user code at test_harness.py:{_line('# the stuck line')} in "
         "slow_step while rank 0 waits in all_reduce #"),
        ("sigstop", "rank 1 is frozen (SIGSTOP or a debugger) at test_harness.py:"
         f"{_line('a look of the progress sampler')} in stuck_in_user_code while rank 0 waits "
         "in all_reduce #"),
        ("diverge", "ranks diverged: rank 0 in all_reduce #"),
    ],
)  # fmt: skip
def test_a_hang_is_named_long_before_the_timeout(mode: str, said: str) -> None:
    started = time.monotonic()
    with pytest.raises(DistributedTestHang) as caught:
        run_distributed(stuck_in_user_code, mode, timeout=240, hang_timeout=5)
    assert time.monotonic() - started < 120  # not the 240 s of the whole run
    assert caught.value.verdict.startswith(said), caught.value.verdict
    assert "no rank made progress for" in str(caught.value)
    assert caught.value.unfinished  # killed
    assert isinstance(caught.value, DistributedTestTimeout)  # what a timeout handler catches


def test_a_straggler_is_no_hang() -> None:
    run_distributed(stuck_in_user_code, "straggler", timeout=120, hang_timeout=3)


def test_a_call_at_a_scripts_top_level_says_to_put_it_under_main(tmp_path: Path) -> None:
    """The new processes import the script again; a call at its top level would have each of
    them start processes too. What the script's user sees names the fix, not only Python's
    "bootstrapping phase" error."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import os\n"
        "from unidist.testing import run_distributed\n"
        "print(run_distributed(os.getpid, world_size=2, init=False, timeout=60))\n"
    )
    src = Path(__file__).resolve().parents[2] / "src"
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode != 0, done.stdout
    said = done.stdout + done.stderr
    assert 'HINT: put the call (and check_adapter\'s) under `if __name__ == "__main__":`' in said
