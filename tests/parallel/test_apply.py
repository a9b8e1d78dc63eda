"""``ParallelismConfig.apply`` trains over real gloo processes exactly like the unsharded model.

Each rank trains a few SGD steps on its share of a fixed batch; the parameters (and the first
step's gradients), gathered back to full tensors, must equal those of one unsharded model trained
on the whole batch in the same process.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

import unidist
from unidist._base.workarounds import GLOO_NO_AVG_ALL_REDUCE
from unidist.parallel import ParallelismConfig
from unidist.testing import run_distributed

pytestmark = pytest.mark.multiprocess

STEPS = 3
TOLERANCE = 1e-5
MLP = {"0": "colwise", "2": "rowwise"}


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(8, 4, generator=generator), torch.randn(8, 2, generator=generator)


def clean(name: str) -> str:
    for wrapper in ("_fsdp_wrapped_module.", "module."):
        name = name.replace(wrapper, "")
    return name


def full(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    value = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
    return value.detach().clone()


def snapshot(model: nn.Module, grads: bool) -> dict[str, torch.Tensor]:
    """Full parameters (or gradients) by unwrapped name, whatever wraps the model."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    def read() -> dict[str, torch.Tensor]:
        out = {}
        for name, param in model.named_parameters():
            value = param.grad if grads else param
            assert value is not None, name
            out[clean(name)] = full(value)
        return out

    if isinstance(model, FullyShardedDataParallel):
        with FullyShardedDataParallel.summon_full_params(model, with_grads=grads):
            return read()
    return read()


def train(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    first_grads: dict[str, torch.Tensor] = {}
    for step in range(STEPS):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        if step == 0:
            first_grads = snapshot(model, grads=True)
        optimizer.step()
    return snapshot(model, grads=False), first_grads


def train_and_compare(settings: dict[str, Any], data_groups: int) -> dict[str, Any]:
    """Rank body: returns the largest differences to the unsharded reference."""
    rank = unidist.get_rank()
    config = ParallelismConfig.from_dict(settings)
    wrapped = config.apply(make_model())
    x, y = batch()
    # Ranks of one data-parallel group see the same rows (TP splits the layers, not the data).
    group = rank * data_groups // unidist.get_world_size()
    params, grads = train(wrapped, x.chunk(data_groups)[group], y.chunk(data_groups)[group])
    reference_params, reference_grads = train(make_model(), x, y)
    assert params.keys() == reference_params.keys()
    return {
        "wrapper": type(wrapped).__name__,
        "param_diff": max((params[k] - reference_params[k]).abs().max().item() for k in params),
        "grad_diff": max((grads[k] - reference_grads[k]).abs().max().item() for k in grads),
        "sharded": any(
            type(p).__name__ == "DTensor" or p.numel() < q.numel()
            for p, q in zip(wrapped.parameters(), make_model().parameters(), strict=False)
        ),
    }


def check(results: list[dict[str, Any]], wrapper: str, sharded: bool) -> None:
    for rank, result in enumerate(results):
        assert result["wrapper"] == wrapper, rank
        assert result["param_diff"] < TOLERANCE, (rank, result)
        assert result["grad_diff"] < TOLERANCE, (rank, result)
        assert result["sharded"] is sharded, (rank, result)


def test_ddp_equals_the_unsharded_model() -> None:
    results = run_distributed(train_and_compare, {}, 2, world_size=2)
    check(results, "DistributedDataParallel", sharded=False)


def wrap_ddp(settings: dict[str, Any]) -> tuple[list[str], bool]:
    """Rank body: the warnings DDP's wrapping raised, and the wrapper's broadcast_buffers."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapped = ParallelismConfig.from_dict(settings).apply(make_model())
    said = [str(w.message) for w in caught if "broadcast_buffers" in str(w.message)]
    return said, bool(wrapped.broadcast_buffers)


def test_ddp_with_default_buffers_raises_no_deprecation_warning() -> None:
    # torch 2.13 deprecated DDP's broadcast_buffers and warns when it is passed, True included:
    # unidist passed it always, and every script on the newest torch printed the warning.
    results = run_distributed(wrap_ddp, {}, world_size=2)
    assert results == [([], True), ([], True)]
    quiet = run_distributed(wrap_ddp, {"ddp": {"broadcast_buffers": False}}, world_size=2)
    assert [broadcast for _, broadcast in quiet] == [False, False]


def test_fsdp2_equals_the_unsharded_model() -> None:
    settings = {"fsdp2": {"wrap": ["Linear"]}}
    results = run_distributed(train_and_compare, settings, 2, world_size=2)
    check(results, "FSDPSequential", sharded=True)  # fully_shard swaps in a subclass


def test_fsdp_v1_runs_on_the_cpu_over_gloo() -> None:
    # torch 2.7's FSDP v1 refuses the CPU unless device_id says so; apply() passes it.
    settings = {"fsdp": {"wrap": ["Linear"], "sharding_strategy": "FULL_SHARD"}}
    results = run_distributed(train_and_compare, settings, 2, world_size=2)
    check(results, "FullyShardedDataParallel", sharded=True)


def test_tensor_parallel_on_the_cpu_over_gloo() -> None:
    results = run_distributed(train_and_compare, {"tp": {"degree": -1, "plan": MLP}}, 1)
    check(results, "Sequential", sharded=True)


def test_fsdp2_with_tensor_parallel_on_a_2d_mesh() -> None:
    settings = {"fsdp2": {}, "tp": {"degree": 2, "plan": MLP}}
    results = run_distributed(train_and_compare, settings, 2, world_size=4, timeout=120)
    check(results, "FSDPSequential", sharded=True)


def apply_and_report(settings: dict[str, Any]) -> str:
    try:
        ParallelismConfig.from_dict(settings).apply(make_model())
    except unidist.ConfigurationError as exc:
        return str(exc)
    return "no error"


def test_hsdp_over_gloo_trains_where_gloo_averages_and_is_refused_elsewhere() -> None:
    """torch < 2.8: refused up front (else it fails in backward); later: like the unsharded one."""
    if GLOO_NO_AVG_ALL_REDUCE.present():
        settings = {"fsdp2": {"replicate_degree": 2, "shard_degree": 1}}
        for message in run_distributed(apply_and_report, settings, world_size=2):
            assert "FSDP2 with replicate_degree=2 (HSDP) cannot run over gloo" in message
            assert "ReduceOp.AVG" in message
        return
    settings = {"fsdp2": {"replicate_degree": 2, "shard_degree": 2}}
    results = run_distributed(train_and_compare, settings, 4, world_size=4, timeout=120)
    check(results, "FSDPSequential", sharded=True)


def test_single_process_only_moves_the_model() -> None:
    model = make_model()
    assert ParallelismConfig.from_dict({"fsdp2": {}}).apply(model, device="cpu") is model
    assert type(model) is nn.Sequential


def test_a_wrapped_model_is_refused() -> None:
    wrapped = nn.DataParallel(make_model())
    with pytest.raises(unidist.ConfigurationError, match=r"already wrapped \(DataParallel\)"):
        ParallelismConfig().apply(wrapped)
