"""``auto_model`` / ``auto_optim``: DDP with several processes, never DataParallel in one."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import unidist
from unidist.session import lifecycle
from unidist.testing import run_distributed


def make_model(batchnorm: bool = False) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(4, 8)]
    if batchnorm:
        layers.append(nn.BatchNorm1d(8))
    return nn.Sequential(*layers, nn.ReLU(), nn.Linear(8, 2))


def full(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def wrap_and_step(via: str | None, sync_batchnorm: bool, parallelism: Any) -> dict[str, Any]:
    rank, world = unidist.get_rank(), unidist.get_world_size()
    model = unidist.auto_model(
        make_model(sync_batchnorm), parallelism, sync_batchnorm=sync_batchnorm, via=via
    )
    optimizer = unidist.auto_optim(torch.optim.SGD(model.parameters(), lr=0.1), via=via)
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 4, generator=generator), torch.randn(8, 2, generator=generator)
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x.chunk(world)[rank]), y.chunk(world)[rank]).backward()
    grads = [full(p.grad) for p in model.parameters() if p.grad is not None]
    everyone = unidist.all_gather_object([g.tolist() for g in grads])
    return {
        "wrapper": type(model).__name__,
        "modules": sorted({type(m).__name__ for m in model.modules()}),
        "same_grads_on_every_rank": all(other == everyone[0] for other in everyone),
        "optimizer_unchanged": type(optimizer) is torch.optim.SGD,
    }


@pytest.mark.multiprocess
@pytest.mark.parametrize("via", [None, pytest.param("ignite", marks=pytest.mark.ignite)])
def test_auto_model_wraps_in_ddp_with_two_processes(via: str | None) -> None:
    for result in run_distributed(wrap_and_step, via, False, None, world_size=2):
        assert result["wrapper"] == "DistributedDataParallel"
        assert result["same_grads_on_every_rank"]
        assert result["optimizer_unchanged"]


def sync_batchnorm_on_cpu(via: str | None, parallelism: Any) -> str:
    try:
        unidist.auto_model(make_model(True), parallelism, sync_batchnorm=True, via=via)
    except unidist.ConfigurationError as exc:
        return str(exc)
    return "no error"


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("via", "parallelism"),
    [(None, None), (None, {"fsdp2": {}}), ("ignite", None)],
)
def test_sync_batchnorm_on_the_cpu_is_refused_up_front(via: str | None, parallelism: Any) -> None:
    for message in run_distributed(sync_batchnorm_on_cpu, via, parallelism, world_size=2):
        assert "sync_batchnorm=True on the CPU: torch's DDP refuses SyncBatchNorm" in message


@pytest.mark.multiprocess
def test_auto_model_takes_a_parallelism_config() -> None:
    for result in run_distributed(wrap_and_step, None, False, {"fsdp2": {}}, world_size=2):
        assert result["wrapper"] == "FSDPSequential"


def test_one_process_never_gets_data_parallel(monkeypatch: pytest.MonkeyPatch) -> None:
    # A host with 4 GPUs: Ignite's auto_model would wrap in DataParallel (ignite#2447).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    model = make_model()
    assert unidist.auto_model(model, device="cpu") is model
    assert unidist.auto_model(model, device="cpu", via="ignite") is model
    assert unidist.auto_model(model, device="cpu", sync_batchnorm=True) is model


def test_auto_optim_is_a_no_op_for_native_backends() -> None:
    optimizer = torch.optim.SGD(make_model().parameters(), lr=0.1)
    assert unidist.auto_optim(optimizer) is optimizer
    assert unidist.auto_optim(optimizer, via="ignite") is optimizer


def test_auto_optim_refuses_xla_without_ignite(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(lifecycle, "backend", lambda: "xla")
    optimizer = torch.optim.SGD(make_model().parameters(), lr=0.1)
    with pytest.raises(unidist.ConfigurationError, match=r"xm.optimizer_step.*via='ignite'"):
        unidist.auto_optim(optimizer)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: unidist.auto_model(m, via="horovod"), "auto_model(via='horovod'): expected"),
        (lambda m: unidist.auto_optim(m, via="xla"), "auto_optim(via='xla'): expected"),
        (
            lambda m: unidist.auto_model(m, {"fsdp2": {}}, via="ignite"),
            "via='ignite') takes no parallelism config",
        ),
        (lambda m: unidist.auto_model(m, 3), "takes a unidist ParallelismConfig or a dict"),
        (lambda m: unidist.auto_model(m, {"fdsp": {}}), "unknown parallelism section 'fdsp'"),
        (lambda m: unidist.auto_model(nn.DataParallel(m)), "already wrapped (DataParallel)"),
    ],
)
def test_bad_calls(call: Any, message: str) -> None:
    with pytest.raises(unidist.ConfigurationError) as caught:
        call(make_model())
    assert message in str(caught.value)


def wrap_with_ddp_keywords(via: str | None) -> dict[str, Any]:
    model = unidist.auto_model(
        make_model(), find_unused_parameters=True, broadcast_buffers=False, via=via
    )
    return {
        "wrapper": type(model).__name__,
        "find_unused_parameters": getattr(model, "find_unused_parameters", None),
        "broadcast_buffers": getattr(model, "broadcast_buffers", None),
    }


@pytest.mark.multiprocess
@pytest.mark.parametrize("via", [None, pytest.param("ignite", marks=pytest.mark.ignite)])
def test_extra_keywords_reach_ddp_as_in_ignite(via: str | None) -> None:
    for result in run_distributed(wrap_with_ddp_keywords, via, world_size=2):
        assert result == {
            "wrapper": "DistributedDataParallel",
            "find_unused_parameters": True,
            "broadcast_buffers": False,
        }


def test_ddp_keywords_are_checked_in_one_process_too() -> None:
    model = make_model()
    assert unidist.auto_model(model, device="cpu", find_unused_parameters=True) is model
    with pytest.raises(unidist.ConfigurationError) as caught:
        unidist.auto_model(model, device="cpu", find_unused_params=True)
    message = str(caught.value)
    assert "find_unused_params=True" in message
    assert "did you mean 'find_unused_parameters'" in message
    assert "It takes: " in message
    assert "broadcast_buffers" in message


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(sync_bn=True), "HINT: use sync_batchnorm=True"),
        (dict(device_ids=[0]), "unidist sets DDP's device_ids"),
        (dict(parallelism={"fsdp2": {}}, static_graph=True), "asks for 'fsdp2'"),
        (dict(bogus=1), "does not take"),
    ],
)
def test_keywords_auto_model_refuses(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(unidist.ConfigurationError) as caught:
        unidist.auto_model(make_model(), device="cpu", **kwargs)
    assert message in str(caught.value)


class Holder(nn.Module):
    """A model of the user's own whose child is called ``module`` (as ComposerClassifier's is)."""

    def __init__(self) -> None:
        super().__init__()
        self.module = make_model()


def test_unwrap_model_in_one_process() -> None:
    model = make_model()
    assert unidist.unwrap_model(model) is model
    assert unidist.unwrap_model(unidist.auto_model(model, device="cpu")) is model
    assert unidist.unwrap_model(nn.DataParallel(model)) is model
    compiled = torch.compile(model)  # compiles on the first call only: cheap here
    assert compiled is not model
    assert unidist.unwrap_model(compiled) is model
    assert unidist.unwrap_model(torch.compile(nn.DataParallel(model))) is model
    holder = Holder()  # a `.module` that is part of the user's model is not peeled
    assert unidist.unwrap_model(holder) is holder


def unwrap_wrapped(parallelism: Any, compile_it: bool) -> dict[str, Any]:
    model = make_model()
    wrapped = unidist.auto_model(model, parallelism, device="cpu")
    if compile_it:
        wrapped = torch.compile(wrapped)
    inner = unidist.unwrap_model(wrapped)
    return {
        "wrapper": type(wrapped).__name__,
        "is_original": inner is model,
        "shares_parameters": {id(p) for p in inner.parameters()}
        <= {id(p) for p in wrapped.parameters()},
    }


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("parallelism", "compile_it", "wrapper"),
    [
        (None, False, "DistributedDataParallel"),
        (None, True, "OptimizedModule"),
        ({"fsdp": {"sharding_strategy": "FULL_SHARD"}}, False, "FullyShardedDataParallel"),
        ({"fsdp2": {}}, False, "FSDPSequential"),  # sharded in place: nothing to peel
    ],
)
def test_unwrap_model_with_two_processes(parallelism: Any, compile_it: bool, wrapper: str) -> None:
    for result in run_distributed(unwrap_wrapped, parallelism, compile_it, world_size=2):
        assert result == {"wrapper": wrapper, "is_original": True, "shares_parameters": True}
