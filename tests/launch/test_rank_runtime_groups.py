"""In the ranks unidist launches, torch < 2.8 keeps every group a full destroy ends, until exit.

A thread that reads the groups (the progress sampler) must never drop the last reference to
one: on torch < 2.8 that runs gloo's destructor on that thread, with the GIL held, while a
worker waits for the GIL (pytorch PR #154976). Later torch has no such destructor: nothing is
kept and ``destroy_process_group`` is torch's own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unidist._base.workarounds import GLOO_TEARDOWN_DEADLOCK

from .helpers import launch

pytestmark = pytest.mark.multiprocess

SCRIPT = """
import json, weakref
import torch, torch.distributed as dist
from unidist.launch.rank import runtime
dist.init_process_group("gloo")
sub = dist.new_group([0, 1])  # a framework's temporary group, say
dist.all_reduce(torch.ones(1), group=sub)
gone = weakref.ref(sub)
del sub
dist.destroy_process_group()  # everything at once
print(json.dumps({
    "patched": dist.destroy_process_group.__module__,
    "kept": len(runtime._kept_groups),
    "sub_kept": any(g is gone() for g in runtime._kept_groups) if gone() else False,
}), flush=True)
"""


def test_a_full_destroy_keeps_every_group_where_gloo_deadlocks(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    done = launch("-n", "2", "--log-dir", str(tmp_path / "logs"), str(script))
    assert done.returncode == 0, done.stderr
    lines = [line.split(": ", 1)[1] for line in done.stdout.splitlines() if "patched" in line]
    assert len(lines) == 2, done.stdout
    for line in lines:
        seen = json.loads(line)
        if GLOO_TEARDOWN_DEADLOCK.present():
            assert seen["patched"] == "unidist.launch.rank.runtime"
            assert seen["sub_kept"] is True  # the subgroup too, not only the world
        else:
            assert seen["patched"] == "torch.distributed.distributed_c10d"
            assert seen["kept"] == 0
