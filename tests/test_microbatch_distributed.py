"""MicroBatcher over 2 gloo processes: OOM on one rank only, in forward or backward, with DDP."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import unidist
from unidist.errors import DistributedTimeoutError, MicrobatchOOMError
from unidist.session import lifecycle
from unidist.session.communicator import CollectiveCommunicator
from unidist.testing import OOMBudget, run_distributed

pytestmark = pytest.mark.multiprocess

F64 = torch.float64


def make_model(batchnorm: bool = False) -> nn.Module:
    torch.manual_seed(0)  # the same weights on every rank and for the reference
    layers: list[nn.Module] = [nn.Linear(6, 16)]
    if batchnorm:
        layers.append(nn.BatchNorm1d(16))
    layers += [nn.Tanh(), nn.Linear(16, 3)]
    return nn.Sequential(*layers).to(F64)


def data(step: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * unidist.get_rank() + step)
    return torch.randn(n, 6, generator=gen, dtype=F64), torch.randn(n, 3, generator=gen, dtype=F64)


def mse(model: nn.Module) -> Any:
    return lambda b: F.mse_loss(model(b[0]), b[1])


def worst_relative(model: nn.Module, reference: nn.Module, grads: bool = False) -> float:
    """Largest |a - b| / max|b| over the parameters (or their gradients)."""
    worst = 0.0
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        left, right = (a.grad, b.grad) if grads else (a, b)
        assert left is not None
        assert right is not None
        worst = max(worst, ((left - right).abs().max() / right.abs().max()).item())
    return worst


def train_against_ddp(during: str, batch: int, budget: int, steps: int, uneven: bool) -> dict:
    """DDP + MicroBatcher (rank 1 has a budget) next to plain full-batch DDP, step by step.

    With ``uneven``, rank 1 has 3 more samples, and the DDP wrapper sits inside a container
    (as with torch.compile), where MicroBatcher must still find it.
    """
    n = batch + (3 * unidist.get_rank() if uneven else 0)
    ddp = DDP(make_model())
    model, reference = (nn.Sequential(ddp) if uneven else ddp), DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    mb = unidist.MicroBatcher(model)
    oom = OOMBudget({1: budget}, during=during)  # type: ignore[arg-type]
    sizes, grad_err, param_err = [], 0.0, 0.0
    with oom.attach(ddp.module):
        for step in range(steps):
            x, y = data(step, n)
            loss = mb.step((x, y), mse(model))
            ref_opt.zero_grad()
            ref_loss = F.mse_loss(reference(x), y)
            ref_loss.backward()
            assert torch.allclose(loss, ref_loss.detach(), rtol=1e-9)
            grad_err = max(grad_err, worst_relative(model, reference, grads=True))
            opt.step()
            ref_opt.step()
            param_err = max(param_err, worst_relative(model, reference))
            sizes.append(mb.size)
    return {
        "sizes": sizes,
        "retries": mb.retries,
        "grad_err": grad_err,
        "param_err": param_err,
        "raised": oom.raised,
        "history": [(c.old, c.new) for c in mb.history],
    }


@pytest.mark.parametrize("during", ["forward", "backward"])
def test_only_rank_1_runs_out_and_both_ranks_settle(during: str) -> None:
    results = run_distributed(train_against_ddp, during, 16, 5, 3, False)
    assert results[0]["sizes"] == results[1]["sizes"] == [4, 4, 4]
    assert results[0]["history"] == results[1]["history"] == [(16, 8), (8, 4)]
    assert results[0]["retries"] == results[1]["retries"] == 2
    assert results[0]["raised"] == 0
    assert results[1]["raised"] >= 2
    for r in results:
        assert r["grad_err"] < 1e-6
        assert r["param_err"] < 1e-6


def test_uneven_batches_match_ddp() -> None:
    # Rank 0 has 10 samples, rank 1 has 13 and a budget of 3: DDP averages the two rank means.
    results = run_distributed(train_against_ddp, "backward", 10, 3, 2, True)
    assert results[0]["sizes"] == results[1]["sizes"] == [3, 3]
    assert results[0]["history"] == [(13, 6), (6, 3)]
    for r in results:
        assert r["grad_err"] < 1e-6
        assert r["param_err"] < 1e-6


def oom_at_minimum() -> dict:
    model = DDP(make_model())
    mb = unidist.MicroBatcher(model)
    with OOMBudget({1: 0}).attach(model.module):
        try:
            mb.step(data(0, 4), mse(model))
        except MicrobatchOOMError as exc:
            return {
                "error": str(exc),
                "history": [(c.old, c.new) for c in mb.history],
                "grads": [p.grad is None for p in model.parameters()],
            }
    return {"error": None}


def test_oom_at_size_one_raises_everywhere() -> None:
    results = run_distributed(oom_at_minimum)
    for r in results:
        assert r["history"] == [(4, 2), (2, 1)]
        assert "microbatch size 1, the minimum" in r["error"]
        assert "rank 1: torch.OutOfMemoryError" in r["error"]
        assert "HINT:" in r["error"]
        assert all(r["grads"])  # the partial gradients are gone


def fail_on(rank: int, where: str = "loss") -> tuple[str, str]:
    model = DDP(make_model())

    def size_fn(batch: Any) -> int:
        if where == "size" and unidist.get_rank() == rank and mb.tracker.steps == 1:
            raise ValueError("boom in the user's loss")
        return len(batch[0])

    mb = unidist.MicroBatcher(model, timeout=20, size_fn=size_fn)

    def loss_fn(b: Any) -> torch.Tensor:
        if where == "loss" and unidist.get_rank() == rank:
            raise ValueError("boom in the user's loss")
        return F.mse_loss(model(b[0]), b[1])

    mb.step(data(0, 8), mse(model))  # one good step first
    try:
        mb.step(data(1, 8), loss_fn)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "no error", ""


@pytest.mark.parametrize(("failing", "where"), [(0, "loss"), (1, "loss"), (1, "size")])
def test_non_oom_error_on_one_rank_fails_the_other(failing: int, where: str) -> None:
    results = run_distributed(fail_on, failing, where, timeout=60)
    assert results[failing] == ("ValueError", "boom in the user's loss")
    kind, message = results[1 - failing]
    assert kind == "RemoteError"
    assert f"rank {failing} failed during MicroBatcher.step" in message
    assert "ValueError: boom in the user's loss" in message


def abort_early() -> list[int]:
    """Rank 1 runs out at once; rank 0 waits for its flag, then must abandon its attempt."""
    model = DDP(make_model())
    mb = unidist.MicroBatcher(model, policy=unidist.SizePolicy(start=4), abort_check_interval=0)
    plane = lifecycle.session_for("test").comm.plane
    assert plane is not None
    calls: list[int] = []

    def loss_fn(b: Any) -> torch.Tensor:
        calls.append(len(b[0]))
        if unidist.get_rank() == 0 and len(calls) == 1:
            deadline = time.monotonic() + 20
            while not plane.flag_is_raised(f"microbatch/{mb._id}/1"):
                assert time.monotonic() < deadline, "rank 1 never raised its flag"
        return F.mse_loss(model(b[0]), b[1])

    with OOMBudget({1: 2}).attach(model.module):
        mb.step(data(0, 16), loss_fn)
    return calls


def test_healthy_ranks_abort_their_attempt_early() -> None:
    calls = run_distributed(abort_early)
    # Attempt 1 at size 4: rank 0 stops after its first microbatch (of 4), rank 1 fails in its
    # first. Attempt 2 at size 2: 8 microbatches each.
    assert calls[0] == [4] + [2] * 8
    assert calls[1] == [4] + [2] * 8


def batchnorm_against_accumulation() -> dict:
    """BatchNorm buffers after a retry equal hand-written DDP accumulation at the final size."""
    model, reference = DDP(make_model(batchnorm=True)), DDP(make_model(batchnorm=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    mb = unidist.MicroBatcher(model)
    batches = [data(step, 12) for step in range(3)]
    with OOMBudget({1: 4}, during="backward").attach(model.module):
        for batch in batches:
            mb.step(batch, mse(model))
            opt.step()
    size = mb.size
    assert size is not None
    for x, y in batches:
        ref_opt.zero_grad()
        parts = list(zip(x.split(size), y.split(size), strict=True))
        for i, (xs, ys) in enumerate(parts):
            sync = i == len(parts) - 1
            with reference.no_sync() if not sync else contextlib.nullcontext():
                (F.mse_loss(reference(xs), ys) * len(xs) / len(x)).backward()
        ref_opt.step()
    buffers = [
        (a.double() - b.double()).abs().max().item()
        for a, b in zip(model.buffers(), reference.buffers(), strict=True)
    ]
    return {"size": size, "param_err": worst_relative(model, reference), "buffers": buffers}


def test_batchnorm_buffers_are_restored_and_broadcast_like_ddp() -> None:
    results = run_distributed(batchnorm_against_accumulation)
    for r in results:
        assert r["size"] == 3
        assert r["param_err"] < 1e-6
        assert max(r["buffers"]) < 1e-9


def without_control_plane() -> dict:
    """No control store: votes go over the gloo group; a plain module averages by itself."""
    session = lifecycle.session_for("test")
    # Keep rank 0's store alive (in the kept communicator): other ranks may still use it.
    kept, session.comm = session.comm, CollectiveCommunicator(session)
    model, reference = make_model(), DDP(make_model())
    mb = unidist.MicroBatcher(model, sync_gradients=True)
    with OOMBudget({0: 3}).attach(model):
        for step in range(2):
            x, y = data(step, 8)
            mb.step((x, y), mse(model))
            reference.zero_grad()
            F.mse_loss(reference(x), y).backward()
    session.comm = kept
    return {"size": mb.size, "grad_err": worst_relative(model, reference, grads=True)}


def test_without_control_plane_and_with_a_plain_module() -> None:
    for r in run_distributed(without_control_plane):
        assert r["size"] == 2
        assert r["grad_err"] < 1e-6


def one_rank_never_comes() -> str:
    model = DDP(make_model())
    if unidist.get_rank() == 1:
        return "skipped the step"
    try:
        unidist.MicroBatcher(model, timeout=2).step(data(0, 4), mse(model))
    except DistributedTimeoutError as exc:
        return str(exc)
    return "no error"


def test_a_rank_that_never_votes_times_out_by_name() -> None:
    first, second = run_distributed(one_rank_never_comes)
    assert "rank(s) [1] did not arrive within 2 s" in first
    assert "MicroBatcher vote" in first
    assert second == "skipped the step"


def store_keys_over_steps() -> list[int]:
    model = DDP(make_model())
    mb = unidist.MicroBatcher(model)
    plane = lifecycle.session_for("test").comm.plane
    assert plane is not None
    counts = []
    with OOMBudget({1: 3}).attach(model.module):
        for step in range(30):
            mb.step(data(step, 8), mse(model))
            if step in (5, 17, 29):
                unidist.barrier()
                counts.append(plane._store.num_keys())
    return counts


def test_votes_and_flags_do_not_grow_the_store() -> None:
    # Growth would show as at least one key per vote (12 votes between two points; 2 x 12 keys
    # without the clean-up). One key's presence depends on timing when the count is read (an
    # outcome is deleted lazily, by the first rank to arrive at a later call: 5 or 6 keys in
    # runs on a loaded machine), so the counts may differ by one, never more.
    for counts in run_distributed(store_keys_over_steps):
        assert max(counts) - min(counts) <= 1, counts


def oom_after_good_steps() -> dict:
    """Two good steps, then rank 1 runs out of memory: the retry runs with the first bucket's
    all-reduce started before every vote, and the gradients still match full-batch DDP."""
    ddp, reference = DDP(make_model()), DDP(make_model())
    mb = unidist.MicroBatcher(ddp)
    started: list[bool] = []
    real = torch.distributed.all_reduce

    def recording(*args: Any, **kwargs: Any) -> Any:
        started.append(bool(kwargs.get("async_op")))
        return real(*args, **kwargs)

    grad_err, per_step = 0.0, []
    oom = OOMBudget({1: None})
    with oom.attach(ddp.module), pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.distributed, "all_reduce", recording)
        for step in range(4):
            if step == 2:
                oom.budget = {1: 4}  # rank 1 runs out in step 3's first attempt
            x, y = data(step, 8)
            started.clear()
            mb.step((x, y), mse(ddp))
            per_step.append(started.count(True))
            reference.zero_grad()
            F.mse_loss(reference(x), y).backward()
            grad_err = max(grad_err, worst_relative(ddp, reference, grads=True))
    return {"grad_err": grad_err, "started": per_step, "retries": mb.retries, "size": mb.size}


def test_an_oom_after_good_steps_retries_with_the_all_reduce_started_early() -> None:
    for r in run_distributed(oom_after_good_steps):
        assert r["grad_err"] < 1e-6
        # Step 1 votes before any all-reduce; then one started per attempt (step 3 has two).
        assert r["started"] == [0, 1, 2, 1]
        assert r["retries"] == 1
        assert r["size"] == 4


def stall_after_a_good_step() -> str:
    """Rank 1 stalls in its second step past the vote's timeout, then goes on."""
    model = DDP(make_model())
    mb = unidist.MicroBatcher(model, timeout=2)
    mb.step(data(0, 4), mse(model))

    def loss_fn(b: Any) -> torch.Tensor:
        if unidist.get_rank() == 1:
            time.sleep(4)
        return F.mse_loss(model(b[0]), b[1])

    try:
        mb.step(data(1, 4), loss_fn)
    except unidist.UnidistError as exc:  # rank 1: whichever it meets when it comes back
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def test_a_rank_that_stalls_with_an_all_reduce_started_times_out_and_the_job_ends() -> None:
    # Rank 0 started the first bucket's all-reduce, then its vote timed out: it must raise by
    # name and both ranks must still finalize (torch 2.7's gloo teardown, pytorch PR #154976).
    first, second = run_distributed(stall_after_a_good_step, timeout=60)
    assert first.startswith("DistributedTimeoutError: ")
    assert "rank(s) [1] did not arrive within 2 s" in first
    assert "MicroBatcher vote" in first
    # Rank 1 comes back after rank 0 left: it completes the vote alone (every count is in) and
    # finds rank 0's started all-reduce, or finds rank 0's store gone. Either way, it ends.
    assert second == "no error" or "MicroBatcher vote" in second, second
