"""What the shims add to their owners' behaviour: deadlines, trust, loud refusals."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest

from unidist.compat import composer as dist, ignite as idist
from unidist.session import state as _state


@pytest.fixture
def local_rank_one_of_two(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process is local rank 1 of a 2-rank job (no process group is needed)."""
    for name, value in {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": "0",
    }.items():
        monkeypatch.setenv(name, value)
    _state.reset()


@pytest.mark.usefixtures("local_rank_one_of_two")
def test_the_download_wait_gives_up_naming_the_file(tmp_path: Path) -> None:
    target = tmp_path / "never.bin"
    with (
        pytest.raises(TimeoutError, match=r"waited 0\.2 s for local rank zero to create .*never"),
        dist.local_rank_zero_download_and_wait(str(target), timeout=0.2),
    ):
        pass


@pytest.mark.usefixtures("local_rank_one_of_two")
def test_the_download_wait_ends_when_the_file_is_there(tmp_path: Path) -> None:
    target = tmp_path / "data.bin"
    target.write_text("x")
    with dist.local_rank_zero_download_and_wait(str(target), timeout=0.2):
        entered = True
    assert entered


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a file of another user")
@pytest.mark.usefixtures("local_rank_one_of_two")
def test_another_users_file_does_not_end_the_wait(tmp_path: Path) -> None:
    target = tmp_path / "data.bin"
    target.write_text("planted")
    os.chown(target, 65534, 65534)
    with (
        mock.patch("os.getuid", return_value=1000),  # as an ordinary user would see it
        pytest.raises(PermissionError, match="belongs to uid 65534"),
        dist.local_rank_zero_download_and_wait(str(target), timeout=5),
    ):
        pass


@pytest.mark.usefixtures("local_rank_one_of_two")
def test_composers_not_initialised_error_when_torch_says_so() -> None:
    # Composer's own test patches the torch function its module consults; so can the shim's.
    with (
        mock.patch.object(dist.dist, "is_initialized", return_value=False),
        pytest.raises(RuntimeError, match="the distributed package is not available or has not"),
        dist.run_local_rank_zero_first(),
    ):
        pass


def test_composers_reduce_operations_are_torchs_names_in_any_case() -> None:
    with pytest.raises(AttributeError, match=r"'median'.*not a name of torch's ReduceOp"):
        dist.all_reduce(mock.Mock(), "median")


@pytest.mark.parametrize(
    "keywords",
    [{"nnodes": 2}, {"node_rank": 1}, {"master_addr": "10.1.2.3"}, {"join": False}],
)
def test_ignites_spawn_refuses_what_it_cannot_keep_before_starting(keywords: dict) -> None:
    with pytest.raises(TypeError, match="unidist launch"):
        idist.spawn("gloo", print, (), nproc_per_node=2, **keywords)


def test_ignites_initialize_refuses_a_file_rendezvous() -> None:
    with pytest.raises(TypeError, match=r"init_method='file:///tmp/x'.*MASTER_ADDR"):
        idist.initialize("gloo", init_method="file:///tmp/x")


def test_ignites_set_local_rank_is_refused_with_the_reason() -> None:
    with pytest.raises(TypeError, match=r"deprecated in Ignite.*launcher's environment"):
        idist.set_local_rank(1)


def test_the_shims_import_neither_framework() -> None:
    import subprocess
    import sys

    code = (
        "import sys, unidist.compat.ignite, unidist.compat.composer; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ignite', 'composer')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


def ignites_test_context(_: object = None) -> tuple[int, int, list[list[int]], float]:
    """Ignite's own test fixture's set-up: WORLD_SIZE set, RANK not, the rank given to torch."""
    import os

    import torch.distributed as dist

    dist.init_process_group("gloo", rank=int(os.environ["LOCAL_RANK"]), world_size=2)
    try:
        loader = idist.auto_dataloader(list(range(8)), batch_size=4, shuffle=False)
        return (
            idist.get_rank(),
            idist.get_world_size(),
            [b.tolist() for b in loader],
            idist.all_reduce(1.5),
        )
    finally:
        idist.finalize()


@pytest.mark.multiprocess
def test_world_size_without_rank_takes_the_rank_from_the_live_group() -> None:
    from unidist.testing import run_distributed

    results = run_distributed(ignites_test_context, init=False, env={"RANK": None})
    assert results == [(0, 2, [[0, 2], [4, 6]], 3.0), (1, 2, [[1, 3], [5, 7]], 3.0)]
