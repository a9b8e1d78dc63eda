"""What only a CUDA device can show: device choice, NCCL, CUDA tensors in collectives, a real OOM.

Every test here is marked ``gpu`` and skips without a CUDA device; ``scripts/gpu-check`` runs
them on a GPU machine (``pytest -m gpu``).
"""

from __future__ import annotations

import pytest
import torch

import unidist
from unidist.testing import run_distributed

pytestmark = pytest.mark.gpu


def test_device_is_the_local_cuda_device_and_current() -> None:
    chosen = unidist.device()
    assert chosen == torch.device("cuda", 0)
    assert torch.cuda.current_device() == 0
    assert unidist.default_backend(chosen) == "nccl"


def test_probe_sees_the_gpu() -> None:
    info = unidist.probe()
    assert info["cuda"]["available"] is True
    assert len(info["cuda"]["devices"]) == torch.cuda.device_count()
    assert info["pick"]["device"].startswith("cuda")


def test_nccl_in_a_world_of_one() -> None:
    unidist.initialize("nccl")
    try:
        assert unidist.backend() == "nccl"
        on_gpu = torch.arange(4.0, device="cuda")
        assert unidist.all_reduce(on_gpu, "mean") is on_gpu
        assert on_gpu.tolist() == [0.0, 1.0, 2.0, 3.0]
        on_cpu = torch.ones(3)  # NCCL needs CUDA: unidist stages it and copies the result back
        assert unidist.all_reduce(on_cpu).tolist() == [1.0, 1.0, 1.0]
        assert unidist.broadcast_object({"lr": 0.1}) == {"lr": 0.1}
        assert [t.device.type for t in unidist.all_gather(on_gpu)] == ["cuda"]
    finally:
        unidist.finalize()


def cuda_collectives() -> tuple[list[float], list[list[float]], list[int], str]:
    rank = unidist.get_rank()
    where = torch.device("cuda", 0)  # both ranks share GPU 0 over gloo
    total = unidist.all_reduce(torch.full((2,), rank + 1.0, device=where))
    rows = unidist.all_gather_uneven(torch.full((rank + 1,), float(rank), device=where))
    sent = unidist.broadcast(torch.arange(3, device=where) * (rank + 1), src=1)
    return total.tolist(), [r.tolist() for r in rows], sent.tolist(), str(total.device)


@pytest.mark.multiprocess
def test_cuda_tensors_in_gloo_collectives_over_two_processes() -> None:
    for total, rows, sent, device in run_distributed(cuda_collectives, backend="gloo"):
        assert total == [3.0, 3.0]
        assert rows == [[0.0], [1.0, 1.0]]
        assert sent == [0, 2, 4]
        assert device == "cuda:0"


def test_a_real_cuda_oom_is_recognised() -> None:
    free, _ = torch.cuda.mem_get_info()
    with pytest.raises(torch.cuda.OutOfMemoryError) as caught:
        torch.empty(int(free * 4), dtype=torch.uint8, device="cuda")
    assert unidist.is_oom(caught.value)
