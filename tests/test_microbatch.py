"""MicroBatcher in one process: splitting, exact gradients, the size policy, errors, buffers."""

from __future__ import annotations

import logging
from collections import namedtuple
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import unidist
from unidist.errors import ConfigurationError, MicrobatchOOMError
from unidist.microbatch import SizePolicy, batch_size, split_batch
from unidist.testing import OOMBudget

F64 = torch.float64


def make_model(batchnorm: bool = False) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(4, 8)]
    if batchnorm:
        layers.append(nn.BatchNorm1d(8))
    layers += [nn.Tanh(), nn.Linear(8, 2)]
    return nn.Sequential(*layers).to(F64)


def batch(n: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=gen, dtype=F64), torch.randn(n, 2, generator=gen, dtype=F64)


def mse(model: nn.Module) -> Any:
    return lambda b: F.mse_loss(model(b[0]), b[1])


def full_batch_grads(b: tuple[torch.Tensor, torch.Tensor]) -> list[torch.Tensor]:
    model = make_model()
    F.mse_loss(model(b[0]), b[1]).backward()
    return [p.grad for p in model.parameters() if p.grad is not None]


def assert_grads(model: nn.Module, expected: list[torch.Tensor]) -> None:
    got = [p.grad for p in model.parameters()]
    assert all(g is not None for g in got)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-12)


# -- splitting ---------------------------------------------------------------------------------


def test_split_batch_structures() -> None:
    x, y = torch.arange(10).reshape(5, 2), torch.arange(5)
    parts = split_batch((x, y), 2)
    assert [len(p[0]) for p in parts] == [2, 2, 1]
    assert isinstance(parts[0], tuple)
    assert parts[2][1].tolist() == [4]
    assert parts[0][0].data_ptr() == x.data_ptr()  # views, not copies
    Pair = namedtuple("Pair", "x y")
    assert isinstance(split_batch(Pair(x, y), 3)[1], Pair)
    d = {"x": x, "meta": {"ids": ["a", "b", "c", "d", "e"], "tag": "train"}, "lr": 0.1}
    first, second = split_batch(d, 3)
    assert first["meta"]["ids"] == ["a", "b", "c"]
    assert second["meta"] == {"ids": ["d", "e"], "tag": "train"}
    assert second["lr"] == 0.1
    assert split_batch(x, 9) == [x]
    assert batch_size([[], {"a": torch.zeros(7, 1)}]) == 7


def test_split_batch_refuses_bad_input() -> None:
    with pytest.raises(ConfigurationError, match=r"dim 0.*\[1\] has shape \(4,\)"):
        split_batch((torch.zeros(5, 2), torch.zeros(4)), 2)
    with pytest.raises(ConfigurationError, match=r"holds no tensor.*HINT: pass split_fn"):
        batch_size(["a", "b"])
    with pytest.raises(ConfigurationError, match="0-dimensional"):
        batch_size(torch.tensor(3.0))
    with pytest.raises(ConfigurationError, match="positive int"):
        split_batch(torch.zeros(4), 0)


# -- exactness ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 3, 5, 16, 40])
def test_gradient_equals_the_full_batch_gradient(size: int) -> None:
    model, b = make_model(), batch()
    mb = unidist.MicroBatcher(model, policy=SizePolicy(start=size))
    loss = mb.step(b, mse(model))
    assert_grads(model, full_batch_grads(b))
    torch.testing.assert_close(loss, F.mse_loss(make_model()(b[0]), b[1]).detach())


def test_sum_reduction_and_outputs() -> None:
    model, b = make_model(), batch(10)
    mb = unidist.MicroBatcher(model, policy=SizePolicy(start=4), reduction="sum")

    def loss_fn(part: Any) -> tuple[torch.Tensor, torch.Tensor]:
        out = model(part[0])
        return ((out - part[1]) ** 2).sum(), out

    loss = mb.step(b, loss_fn)
    reference = make_model()
    expected = ((reference(b[0]) - b[1]) ** 2).sum()
    expected.backward()
    torch.testing.assert_close(loss, expected.detach())
    assert_grads(model, [p.grad for p in reference.parameters()])  # type: ignore[misc]
    assert [len(o) for o in mb.outputs] == [4, 4, 2]
    assert not mb.outputs[0].requires_grad


def test_zero_grad_false_accumulates_across_steps_and_survives_retries() -> None:
    model = make_model()
    mb = unidist.MicroBatcher(model, zero_grad=False)
    with OOMBudget(3, during="backward").attach(model):
        mb.step(batch(8, seed=1), mse(model))
        mb.step(batch(8, seed=2), mse(model))
    first, second = full_batch_grads(batch(8, 1)), full_batch_grads(batch(8, 2))
    expected = [a + b for a, b in zip(first, second, strict=True)]
    assert_grads(model, expected)
    assert mb.retries == 2


def test_custom_split_and_size_functions() -> None:
    model, (x, y) = make_model(), batch(6)
    records = [{"x": x[i], "y": y[i]} for i in range(6)]

    def split(items: list[dict[str, torch.Tensor]], size: int) -> list[list[dict[str, Any]]]:
        return [items[i : i + size] for i in range(0, len(items), size)]

    def loss_fn(part: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        xs = torch.stack([r["x"] for r in part])
        return F.mse_loss(model(xs), torch.stack([r["y"] for r in part]))

    mb = unidist.MicroBatcher(model, policy=SizePolicy(start=4), split_fn=split, size_fn=len)
    mb.step(records, loss_fn)
    assert_grads(model, full_batch_grads((x, y)))
    lossy = unidist.MicroBatcher(model, split_fn=lambda items, size: [items[:size]], size_fn=len)
    lossy.tracker.size = 2
    with pytest.raises(ConfigurationError, match=r"2 samples .* but the batch has 6"):
        lossy.step(records, loss_fn)


# -- the size policy ---------------------------------------------------------------------------


def test_shrinks_logs_and_remembers(caplog: pytest.LogCaptureFixture) -> None:
    model = make_model()
    mb = unidist.MicroBatcher(model)
    caplog.set_level(logging.INFO, logger="unidist.microbatch")
    with OOMBudget(5).attach(model) as oom:
        mb.step(batch(), mse(model))
        assert mb.size == 4
        assert mb.retries == 2
        mb.step(batch(seed=3), mse(model))
    assert mb.retries == 2  # the size is remembered: no new failure
    assert oom.raised == 2  # a count of the errors raised
    assert oom.largest_ok == 4
    assert [(c.step, c.old, c.new) for c in mb.history] == [(0, 16, 8), (0, 8, 4)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings[0].startswith("microbatch size 16 -> 8: out of memory at 16 (rank 0: ")
    assert "in the forward of microbatch 1/1 (size 16)" in warnings[0]


def test_first_successful_step_sets_the_size_and_smaller_batches_fit() -> None:
    model = make_model()
    mb = unidist.MicroBatcher(model)
    assert mb.size is None
    mb.step(batch(16), mse(model))
    assert mb.size == 16
    # Recorded under the step it happened in, step 0, as a shrink on the first step is.
    assert [(c.step, c.old, c.new) for c in mb.history] == [(0, None, 16)]
    mb.step(batch(5), mse(model))  # a short last batch runs whole
    assert mb.size == 16


def test_oom_at_the_minimum_says_what_to_do_and_restores_gradients() -> None:
    model = make_model()
    mb = unidist.MicroBatcher(model, policy=SizePolicy(minimum=2), zero_grad=False)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    with OOMBudget(1).attach(model), pytest.raises(MicrobatchOOMError) as info:
        mb.step(batch(8), mse(model))
    message = str(info.value)
    assert "microbatch size 2, the minimum (SizePolicy.minimum=2)" in message
    assert "HINT: lower SizePolicy.minimum" in message
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in model.parameters())
    assert unidist.is_oom(info.value) is None


class ThirdPolicy(SizePolicy):
    def shrink(self, size: int, failures: int) -> int:
        return size // 3


def test_custom_policy_and_growing_back(caplog: pytest.LogCaptureFixture) -> None:
    model = make_model()
    mb = unidist.MicroBatcher(model, policy=ThirdPolicy(grow_after=2))
    caplog.set_level(logging.INFO, logger="unidist.microbatch")
    budget = OOMBudget(10)
    with budget.attach(model):
        mb.step(batch(27), mse(model))
        assert mb.size == 9
        mb.step(batch(27, 1), mse(model))  # a step with an OOM is not clean: this is the first
        mb.step(batch(27, 2), mse(model))  # second clean step: the next one probes 18
        assert mb.size == 18
        mb.step(batch(27, 3), mse(model))  # the probe fails, back to 9, wait doubles
        assert mb.size == 9
        budget.budget = 100  # memory frees up
        for seed in range(4, 8):
            mb.step(batch(27, seed), mse(model))
        assert mb.size == 18  # probing again after 4 clean steps
        mb.step(batch(27, 8), mse(model))  # the probe succeeds; the wait is 2 again
        mb.step(batch(27, 9), mse(model))
        assert mb.size == 27  # doubling is capped at the batch size
    reasons = [c.reason for c in mb.history]
    # Steps count from 0: the probe decided after the third step (step 2) is recorded there.
    assert [c.step for c in mb.history] == [0, 2, 3, 7, 9]
    assert reasons[0].startswith("out of memory at 27")
    assert reasons[1] == "probing after 2 clean steps"
    assert reasons[2].startswith("the probe at 18 ran out of memory")
    assert reasons[2].endswith("back to 9, next probe after 4 clean steps")
    assert reasons[3:] == ["probing after 4 clean steps", "probing after 2 clean steps"]
    assert any("the probe succeeded" in r.getMessage() for r in caplog.records)
    assert mb.state_dict()["size"] == 27


def test_state_dict_round_trip() -> None:
    model = make_model()
    mb = unidist.MicroBatcher(model)
    with OOMBudget(4).attach(model):
        mb.step(batch(), mse(model))
    resumed = unidist.MicroBatcher(model)
    resumed.load_state_dict(mb.state_dict())
    assert resumed.size == 4
    with pytest.raises(ConfigurationError, match="saved microbatch size"):
        resumed.load_state_dict({"size": 0})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"start": 0}, "start=0"),
        ({"minimum": 0}, "minimum=0"),
        ({"start": 2, "minimum": 4}, "start=2"),
        ({"grow_after": 0}, "grow_after=0"),
    ],
)
def test_policy_validation(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        SizePolicy(**kwargs)


class BrokenPolicy(SizePolicy):
    def shrink(self, size: int, failures: int) -> int:
        return size


def test_a_policy_that_does_not_shrink_is_refused() -> None:
    model = make_model()
    mb = unidist.MicroBatcher(model, policy=BrokenPolicy())
    with OOMBudget(2).attach(model), pytest.raises(ConfigurationError, match="smaller than 16"):
        mb.step(batch(), mse(model))


# -- errors and odd input ----------------------------------------------------------------------


def test_non_oom_errors_propagate_unchanged() -> None:
    model = make_model()
    mb = unidist.MicroBatcher(model)

    def broken(part: Any) -> torch.Tensor:
        raise KeyError("label")

    with pytest.raises(KeyError, match="label"):
        mb.step(batch(), broken)
    assert mb.retries == 0
    with pytest.raises(ConfigurationError, match=r"one-element tensor.*got \(16, 2\)"):
        mb.step(batch(), lambda b: model(b[0]))


def test_constructor_validation() -> None:
    with pytest.raises(ConfigurationError, match=r"torch\.nn\.Module"):
        unidist.MicroBatcher(lambda x: x)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="reduction="):
        unidist.MicroBatcher(make_model(), reduction="avg")  # type: ignore[arg-type]


def test_fsdp_models_are_refused() -> None:
    from torch.distributed.fsdp import FSDPModule

    fake = nn.Linear(2, 2)
    fake.__class__ = type("FSDPLinear", (FSDPModule, nn.Linear), {})  # what fully_shard does
    with pytest.raises(ConfigurationError, match="does not support FSDP"):
        unidist.MicroBatcher(nn.Sequential(fake))


def test_empty_batch_is_a_no_op() -> None:
    model = make_model()
    mb = unidist.MicroBatcher(model)
    loss = mb.step((torch.zeros(0, 4, dtype=F64), torch.zeros(0, 2, dtype=F64)), mse(model))
    assert loss.item() == 0.0
    assert all(p.grad is None for p in model.parameters())


def test_buffers_of_a_failed_attempt_are_restored() -> None:
    model, reference = make_model(batchnorm=True), make_model(batchnorm=True)
    mb = unidist.MicroBatcher(model)
    b = batch(12)
    with OOMBudget(4, during="backward").attach(model):
        mb.step(b, mse(model))
    assert mb.size == 3
    for xs, ys in zip(b[0].split(3), b[1].split(3), strict=True):
        F.mse_loss(reference(xs), ys).backward()
    for mine, theirs in zip(model.buffers(), reference.buffers(), strict=True):
        assert torch.equal(mine, theirs)  # running stats of 4 microbatches, not 4 + 2 + 1
    assert int(model[1].num_batches_tracked) == 4


def test_grad_scaler_scales_the_backward() -> None:
    class Doubling:
        def scale(self, loss: torch.Tensor) -> torch.Tensor:
            return loss * 2

    model, b = make_model(), batch()
    unidist.MicroBatcher(model, policy=SizePolicy(start=5), scaler=Doubling()).step(b, mse(model))
    assert_grads(model, [2 * g for g in full_batch_grads(b)])


def test_oom_budget_validation_and_message_only_errors() -> None:
    with pytest.raises(ConfigurationError, match="during="):
        OOMBudget(1, during="sideways")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="budget="):
        OOMBudget(-1)
    budget = OOMBudget({0: 2}, error=RuntimeError)
    with pytest.raises(RuntimeError, match="CUDA out of memory") as info:
        budget.check(3)
    assert type(info.value) is RuntimeError
    assert unidist.is_oom(info.value) == (
        "message 'CUDA out of memory' (the CUDA caching allocator)"
    )
    OOMBudget({1: 0}).check(100)  # rank 1's budget does not apply to rank 0
