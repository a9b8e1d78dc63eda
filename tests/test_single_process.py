"""One process, no launcher: getters give single-process values, collectives are identities."""

from __future__ import annotations

import pytest
import torch

import unidist
from unidist.errors import ConfigurationError, NotInitializedError


def test_getters_have_single_process_values() -> None:
    assert unidist.topology() == unidist.Topology()
    assert (unidist.get_rank(), unidist.get_world_size()) == (0, 1)
    assert (unidist.get_local_rank(), unidist.get_local_world_size()) == (0, 1)
    assert (unidist.get_node_rank(), unidist.get_num_nodes()) == (0, 1)
    assert unidist.is_main_process()
    assert not unidist.is_initialized()
    assert unidist.backend() is None
    assert unidist.current_adapter().name == "serial"


def test_collectives_are_identities() -> None:
    t = torch.tensor([1.0, 2.0])
    assert unidist.all_reduce(t) is t
    assert t.tolist() == [1.0, 2.0]
    assert unidist.all_reduce(3) == 3
    assert unidist.all_reduce(3, "mean") == 3.0
    assert isinstance(unidist.all_reduce(3, "mean"), float)
    assert unidist.all_reduce(True, "band") is True
    gathered = unidist.all_gather(t)
    assert len(gathered) == 1
    assert gathered[0].tolist() == [1.0, 2.0]
    assert gathered[0] is not t
    assert [x.shape for x in unidist.all_gather_uneven(torch.zeros(5, 2))] == [(5, 2)]
    assert unidist.all_gather_object({"a": 1}) == [{"a": 1}]
    assert unidist.broadcast(t) is t
    assert unidist.broadcast(7) == 7
    assert unidist.broadcast_object("x") == "x"
    unidist.barrier()
    unidist.barrier(timeout=1)
    group = unidist.new_group([0])
    assert unidist.get_world_size(group) == 1
    assert unidist.all_reduce(5, group=group) == 5


def test_single_process_initialize_starts_no_group() -> None:
    topo = unidist.initialize()
    assert topo == unidist.Topology()
    assert unidist.is_initialized()
    assert unidist.backend() is None
    assert not torch.distributed.is_initialized()
    assert unidist.initialize() == topo  # idempotent
    unidist.finalize()
    assert not unidist.is_initialized()
    unidist.finalize()  # twice is fine


def test_single_process_explicit_gloo_group() -> None:
    unidist.initialize("gloo", adapter="torch")
    assert torch.distributed.is_initialized()
    assert unidist.backend() == "gloo"
    assert unidist.all_reduce(torch.tensor([4])).item() == 4
    with pytest.raises(ConfigurationError, match="already initialized with backend 'gloo'"):
        unidist.initialize("nccl")
    with pytest.raises(ConfigurationError, match=r"already initialized with the 'torch' adapter"):
        unidist.initialize(adapter="ignite")
    unidist.finalize()
    assert not torch.distributed.is_initialized()


def test_world_size_two_without_a_group_says_to_initialize(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert unidist.get_world_size() == 2
    with pytest.raises(NotInitializedError, match=r"call unidist.initialize\(\) on every rank"):
        unidist.all_reduce(torch.ones(1))
    with pytest.raises(NotInitializedError, match="barrier needs a process group"):
        unidist.barrier()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: unidist.all_reduce(torch.ones(1), "avg"), "op='avg' is not a reduction"),
        (
            lambda: unidist.all_reduce(torch.ones(1, dtype=torch.int64), "mean"),
            "op='mean' needs a floating-point tensor",
        ),
        (lambda: unidist.all_reduce(torch.ones(1), "band"), "bitwise and needs an integer"),
        (
            lambda: unidist.all_reduce(torch.ones(1, dtype=torch.bool), "sum"),
            "on a bool tensor cannot be stored",
        ),
        (lambda: unidist.all_reduce(1.5, "bor"), "bitwise and needs an int or bool"),
        (lambda: unidist.all_reduce(2**70), "does not fit in torch.int64"),
        (lambda: unidist.all_gather([1, 2]), "HINT: use all_gather_object"),
        (lambda: unidist.all_gather_uneven(torch.tensor(1.0)), "at least one dimension"),
        (lambda: unidist.broadcast(torch.ones(1), src=1), "src=1 is not a rank of the world"),
        (lambda: unidist.new_group([0, 0]), "distinct integer ranks in 0..0"),
        (lambda: unidist.new_group([1]), "distinct integer ranks in 0..0"),
        (lambda: unidist.barrier(timeout=-1), "must be a positive number"),
        (lambda: unidist.broadcast_object(lambda: 1), "not picklable"),
        (
            lambda: unidist.initialize(timeout=0),
            "timeout must be a positive number of seconds or a timedelta, got 0",
        ),
        (lambda: unidist.initialize("nccl"), "backend 'nccl' needs CUDA devices"),
        (lambda: unidist.initialize("smoke-signals"), "backend 'smoke-signals' is not available"),
        (lambda: unidist.initialize(adapter="horovod"), "no adapter named 'horovod'"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigurationError) as caught:
        call()
    assert message in str(caught.value)


def test_one_rank_helpers_in_one_process() -> None:
    calls = []

    @unidist.rank_zero_only
    def zero(x: int) -> int:
        calls.append(x)
        return x * 2

    @unidist.one_rank_only(barrier=True)
    def only() -> str:
        return "ran"

    assert zero(4) == 8
    assert only() == "ran"
    with unidist.one_rank_first():
        calls.append(99)
    assert calls == [4, 99]
    with (
        pytest.raises(ConfigurationError, match=r"rank=1 is not in 0\.\.0"),
        unidist.one_rank_first(rank=1),
    ):
        pass
    assert zero.__name__ == "zero"  # functools.wraps


def test_show_config_starts_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    info = unidist.show_config()
    out = capsys.readouterr().out
    assert "launcher      none" in out
    assert "adapter       torch" in out
    assert info["backends"][0] == "gloo"
    assert not torch.distributed.is_initialized()
