"""A script that ends without ``close()`` while its last save is still being written: the save
is awaited at the interpreter's exit, and if it failed the process says so and exits 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess

#: Saves every 2 steps in the background, for 6 steps; the save of step 6 cannot be written
#: (its files fail with ENOSPC, as on a full disk), and the script ends without close().
SCRIPT = """
import errno, sys
import torch
from torch.distributed.checkpoint import filesystem
import unidist

original = filesystem.FileSystem.create_stream
saves = []

def full_at_step_6(self, path, mode):  # the third save's data file: step 6's
    if str(path).endswith(".distcp") and "w" in mode:
        saves.append(path)
        if len(saves) == 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
    return original(self, path, mode)

filesystem.FileSystem.create_stream = full_at_step_6
def main():  # the state is the function's alone, and gone when it returns
    model = torch.nn.Linear(4, 4)
    state = unidist.ResumableState(sys.argv[1], job="j", model=model, save_every=2,
                                   async_save=True, stop_signals=())
    state.restore()
    for _ in range(6):
        model.weight.data += 1
        state.step()

unidist.initialize()
main()
import gc; gc.collect()
print(f"rank {unidist.get_rank()} returned", flush=True)
"""


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_last_save_that_fails_after_the_script_returned_is_an_error(
    tmp_path: Path, ranks: int
) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    folder = tmp_path / "ck"
    done = subprocess.run(
        [sys.executable, "-m", "unidist", "launch", "-n", str(ranks), "--log-dir",
         str(tmp_path / "logs"), str(script), str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode != 0, done.stderr[-3000:]
    logs = "".join(p.read_text() for p in (tmp_path / "logs").rglob("rank*.stderr.log"))
    assert "returned" in done.stdout  # the script itself ended normally
    assert "the last save of job 'j' (step 6) failed" in logs, logs[-3000:]
    assert "No space left on device" in logs
    assert "so step 4 stays the checkpoint in force" in logs
    assert json.loads((folder / "latest.json").read_text())["step"] == 4
