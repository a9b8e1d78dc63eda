"""Correct FSDP2's gradient average over gloo (torch < 2.9 sums instead, pytorch#162338).

FSDP2 reduce-scatters fp32/bf16 gradients with ``ReduceOp.AVG`` and leaves the division to the
collective. The gloo of torch < 2.9 ignores AVG in ``reduce_scatter_tensor`` and sums (see
:mod:`unidist._base.workarounds`), so every gradient comes out ``shard world size`` times too large,
silently. On those releases, whether the backend does this is probed with one tiny collective;
where it does, an FSDP2 all-reduce hook (a public ``FSDPModule`` API) divides the reduced shard
before it becomes the gradient. A fixed torch is left alone without a probe. fp16 reductions are
pre/post-divided and summed by FSDP2 itself, so the hook skips them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from unidist._base.loaded import loaded_classes
from unidist._base.workarounds import GLOO_AVG_SUMS
from unidist.parallel.strategies import MESH_DIM_NAMES

if TYPE_CHECKING:
    import torch

__all__ = ["GlooAverageFix", "correct_gloo_averaging"]

_SHARD_DIM_NAME = MESH_DIM_NAMES[1]


class _Divide:
    """All-reduce hook: turn the summed fp32/bf16 reduce-scatter output into the average."""

    def __init__(self, divisor: int) -> None:
        self.divisor = divisor

    def __call__(self, reduced: torch.Tensor) -> None:
        import torch

        if reduced.dtype in (torch.float32, torch.bfloat16):  # the dtypes reduced with AVG
            reduced.div_(self.divisor)


def correct_gloo_averaging(model: torch.nn.Module) -> bool | None:
    """Install the correction on every FSDP2 unit of ``model`` if its backend needs it.

    Collective (one small reduce-scatter over the shard group) when the group is gloo: call it
    on every rank.

    Returns:
        None when ``model`` has no FSDP2 units yet, else whether the correction was installed.
    """
    # FSDP2's class only if it is imported: a model it has not sharded imports nothing here.
    sharded = loaded_classes("torch.distributed.fsdp", "FSDPModule")
    units: list[Any] = [module for module in model.modules() if isinstance(module, sharded)]
    if not units:
        return None
    from torch.distributed.tensor import DTensor

    mesh = next((p.device_mesh for p in model.parameters() if isinstance(p, DTensor)), None)
    if mesh is None:
        return None
    names = mesh.mesh_dim_names or ()
    dim = names.index(_SHARD_DIM_NAME) if _SHARD_DIM_NAME in names else 0
    group, size = mesh.get_group(dim), mesh.size(dim)
    if not _averages_are_summed(group, size):
        return False
    divide = _Divide(size)
    for unit in units:
        unit.set_all_reduce_hook(divide)
    return True


def _averages_are_summed(group: Any, size: int) -> bool:
    import torch
    import torch.distributed as dist

    if not GLOO_AVG_SUMS.present() or size == 1 or "gloo" not in str(dist.get_backend(group)):
        return False
    result = torch.empty(1)
    try:
        dist.reduce_scatter_tensor(result, torch.ones(size), op=dist.ReduceOp.AVG, group=group)
    except RuntimeError:
        return False  # AVG refused outright: FSDP2 reports that itself
    return bool(result.item() != 1.0)


class GlooAverageFix:
    """Forward pre-hook that applies :func:`correct_gloo_averaging` once the model is sharded.

    For frameworks that shard the model themselves (Composer's Trainer): it waits for the
    first forward after FSDP2 has wrapped the model, installs the correction, and removes itself.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self._handle = model.register_forward_pre_hook(self)

    def __call__(self, module: torch.nn.Module, args: Any) -> None:
        if correct_gloo_averaging(module) is not None:
            self._handle.remove()
