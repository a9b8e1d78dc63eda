"""Samplers and loaders across real processes over gloo: training with resume, exact-once eval."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from unidist.testing import run_distributed

pytestmark = pytest.mark.multiprocess

LENGTH = 42
BATCH = 4
#: Batches each of the 2 ranks trains in epoch 1 before the checkpoint: 3 * 4 * 2 = 24 samples,
#: which leaves 18, a multiple of both 2 and 3, so the elastic resume needs no padding either.
STEPS_BEFORE_CHECKPOINT = 3


def _train(checkpoint: str, resume: bool, workers: int) -> dict[str, Any]:
    """Train 2 epochs with DDP; without ``resume``, checkpoint mid-epoch 1 and "crash" later."""
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    import unidist

    gen = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.arange(LENGTH), torch.randn(LENGTH, 3, generator=gen))
    loader = unidist.auto_dataloader(
        dataset, per_rank_batch_size=BATCH, num_workers=workers, seed=7
    )
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: dict[int, list[int]] = {0: [], 1: []}
    start = 0
    if resume:
        state = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        start = state["epoch"]
    result: dict[str, Any] = {"world": unidist.get_world_size()}
    for epoch in range(start, 2):
        loader.set_epoch(epoch)
        for step, (ids, x) in enumerate(loader):
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen[epoch].extend(ids.tolist())
            if not resume and epoch == 1 and step == STEPS_BEFORE_CHECKPOINT - 1:
                if unidist.is_main_process():
                    torch.save(
                        {
                            "model": model.state_dict(),
                            "optimizer": optimizer.state_dict(),
                            "loader": loader.state_dict(),
                            "epoch": epoch,
                        },
                        checkpoint,
                    )
                unidist.barrier()
                result["at_checkpoint"] = {e: list(v) for e, v in seen.items()}
                result["prefetched"] = loader.sampler._pass.yielded()  # type: ignore[attr-defined]
            if not resume and epoch == 1 and step == STEPS_BEFORE_CHECKPOINT + 1:
                result["lost"] = list(seen[1])  # trained after the checkpoint: lost in the crash
                return result
    result["seen"] = seen
    result["loss"] = float(loss)
    return result


def _per_epoch(
    first: list[dict[str, Any]], second: list[dict[str, Any]]
) -> dict[int, Counter[int]]:
    counts: dict[int, Counter[int]] = {0: Counter(), 1: Counter()}
    for rank in first:
        for epoch, ids in rank["at_checkpoint"].items():
            counts[int(epoch)].update(ids)
    for rank in second:
        for epoch, ids in rank["seen"].items():
            counts[int(epoch)].update(ids)
    return counts


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("workers", "new_world"), [(2, 2), (0, 3)])
def test_training_resumes_mid_epoch_with_every_sample_once_per_epoch(
    tmp_path: Path, workers: int, new_world: int
) -> None:
    checkpoint = str(tmp_path / "checkpoint.pt")
    first = run_distributed(_train, checkpoint, False, workers, world_size=2, timeout=90)
    taken = STEPS_BEFORE_CHECKPOINT * BATCH
    assert all(len(r["at_checkpoint"][1]) == taken for r in first)
    assert all(len(r["lost"]) > taken for r in first)  # the crash came after more training
    if workers:
        assert all(r["prefetched"] > taken for r in first)  # workers had run ahead
    second = run_distributed(_train, checkpoint, True, 0, world_size=new_world, timeout=90)
    assert all(r["world"] == new_world for r in second)
    counts = _per_epoch(first, second)
    for epoch in (0, 1):
        assert counts[epoch] == Counter(range(LENGTH)), (epoch, counts[epoch])
    assert all(r["loss"] == r["loss"] for r in second)  # finite


def _evaluate(length: int) -> dict[str, Any]:
    import torch

    import unidist

    sampler = unidist.DistributedSampler(length, mode="eval", seed=3)
    loader = unidist.auto_dataloader(
        range(length), per_rank_batch_size=3, sampler=sampler, num_workers=0
    )
    batches = list(loader)
    outputs = torch.cat([batch.float().mul(10).unsqueeze(1) for batch in batches])
    names = [f"sample-{int(i)}" for batch in batches for i in batch]
    return {
        "count": len(outputs),
        "tensor": unidist.gather_in_order(outputs, sampler=sampler).squeeze(1).tolist(),
        "objects": unidist.gather_in_order(names, sampler=sampler),
        "padded": unidist.gather_in_order(
            torch.tensor([unidist.get_rank(), 0]), indices=[unidist.get_rank(), 0]
        ).tolist(),
    }


@pytest.mark.timeout(120)
def test_eval_reads_each_sample_once_and_gathers_in_dataset_order() -> None:
    length = 11
    results = run_distributed(_evaluate, length, world_size=3, timeout=60)
    assert sorted(r["count"] for r in results) == [3, 4, 4]
    for r in results:
        assert r["tensor"] == [10.0 * i for i in range(length)]
        assert r["objects"] == [f"sample-{i}" for i in range(length)]
        assert r["padded"] == [0, 1, 2]  # index 0 came from every rank; kept once
