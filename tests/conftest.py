"""Hygiene for every test: a clean launcher environment, no leaked variables or process groups."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator

import pytest

from unidist import _state, lifecycle
from unidist.adapters import registry

#: Variables that would make the test process look like a rank of some job.
_LAUNCHER_VARIABLE = re.compile(
    r"^(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|NODE_RANK|GROUP_RANK|GROUP_WORLD_SIZE|"
    r"ROLE_RANK|ROLE_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_\w+|SLURM_\w+|OMPI_\w+|"
    r"PMI_\w+|MPI_LOCAL\w+|MV2_\w+|UNIDIST_\w+)$"
)


@pytest.fixture(autouse=True)
def clean_distributed_state() -> Iterator[None]:
    """Strip launcher variables and reset unidist; afterwards fail on leaked variables or groups.

    Deliberately not built on ``monkeypatch``: a test's own ``monkeypatch`` is undone before this
    fixture's teardown, so whatever is still changed here leaked past it.
    """
    original = dict(os.environ)
    for name in list(os.environ):
        if _LAUNCHER_VARIABLE.match(name):
            del os.environ[name]
    before = dict(os.environ)
    _state.reset()
    registry._reset()
    yield
    lifecycle.finalize()
    dist = sys.modules.get("torch.distributed")
    leaked_group = dist is not None and dist.is_initialized()
    if leaked_group:
        dist.destroy_process_group()
    _state.reset()
    registry._reset()
    changed = sorted(
        name
        for name in set(before) | set(os.environ)
        if before.get(name) != os.environ.get(name) and name != "PYTEST_CURRENT_TEST"
    )
    os.environ.clear()
    os.environ.update(original)
    assert not leaked_group, "the test left a torch process group behind"
    assert not changed, f"the test changed environment variables without monkeypatch: {changed}"
