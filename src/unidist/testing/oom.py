"""Simulated out-of-memory errors, to test microbatching (yours or unidist's) on CPU.

:class:`OOMBudget` gives each rank a budget in samples: a module that sees more samples than its
rank's budget in one call raises ``torch.OutOfMemoryError`` with CUDA's wording, during its
forward or during its backward. The budget is checked against dim 0 of the module's first tensor
input, like a real activation footprint that grows with the microbatch.

    budget = OOMBudget({1: 8}, during="backward")   # only rank 1, above 8 samples
    with budget.attach(model):
        loss = microbatcher.step(batch, loss_fn)
    assert budget.raised >= 1
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

from unidist.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

__all__ = ["OOMBudget"]


class OOMBudget:
    """Raise an out-of-memory error when a module's input exceeds this rank's sample budget.

    Args:
        budget: samples per call that fit; an int for every rank, or ``{rank: samples}`` (ranks
            not listed never run out). ``None`` in the mapping also means unlimited.
        during: ``"forward"`` raises before the module runs; ``"backward"`` lets the forward
            pass and raises when the gradient reaches the module's output.
        error: builds the exception from a message; default ``torch.OutOfMemoryError``. Use
            ``RuntimeError`` to imitate allocators that only say it in the message.

    Attributes:
        raised: how many errors it has raised so far (a count, not the errors).
        calls: how many calls it has checked so far.
        largest_ok: the largest input that passed (0 if none).
    """

    def __init__(
        self,
        budget: int | Mapping[int, int | None],
        *,
        during: Literal["forward", "backward"] = "forward",
        error: Callable[[str], BaseException] | None = None,
    ) -> None:
        if during not in ("forward", "backward"):
            raise ConfigurationError(f"during={during!r}; expected 'forward' or 'backward'.")
        limits = budget if isinstance(budget, Mapping) else None
        if limits is None and not _budget_ok(budget):
            raise ConfigurationError(f"budget={budget!r} must be an int >= 0 or a dict.")
        if limits is not None and not all(_budget_ok(v) or v is None for v in limits.values()):
            raise ConfigurationError(f"budget={budget!r}: every value must be an int >= 0 or None.")
        self.budget = budget
        self.during = during
        self._error = error
        self.raised = 0
        self.calls = 0
        self.largest_ok = 0

    def limit(self) -> int | None:
        """This rank's budget (None: unlimited)."""
        if isinstance(self.budget, Mapping):
            from unidist import get_rank

            return self.budget.get(get_rank())
        return self.budget

    def check(self, samples: int, where: str = "forward") -> None:
        """Raise if ``samples`` is over this rank's budget (usable without a module)."""
        self.calls += 1
        limit = self.limit()
        if limit is None or samples <= limit:
            self.largest_ok = max(self.largest_ok, samples)
            return
        self.raised += 1
        message = (
            f"CUDA out of memory. Tried to allocate {samples} samples' worth in the {where}, "
            f"but this rank's budget is {limit} (simulated by unidist.testing.OOMBudget)."
        )
        if self._error is not None:
            raise self._error(message)
        import torch

        raise torch.OutOfMemoryError(message)

    @contextmanager
    def attach(self, module: torch.nn.Module) -> Iterator[OOMBudget]:
        """Check every call of ``module`` while the block runs (hooks are removed after)."""
        import torch

        if not isinstance(module, torch.nn.Module):
            raise ConfigurationError(f"attach() needs a torch.nn.Module, got {type(module)}.")
        if self.during == "forward":
            handle = module.register_forward_pre_hook(self._pre_forward)
        else:
            handle = module.register_forward_hook(self._post_forward)
        try:
            yield self
        finally:
            handle.remove()

    def _pre_forward(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        self.check(_samples(args), "forward")

    def _post_forward(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        import torch

        samples = _samples(args)
        tensor = _first_tensor(output)
        if tensor is None or not tensor.requires_grad:
            return
        if not torch.is_grad_enabled():
            return

        def during_backward(grad: torch.Tensor) -> None:
            self.check(samples, "backward")

        tensor.register_hook(during_backward)


def _budget_ok(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _first_tensor(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, tuple | list):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    if isinstance(value, Mapping):
        return _first_tensor(list(value.values()))
    return None


def _samples(args: tuple[Any, ...]) -> int:
    tensor = _first_tensor(args)
    if tensor is None or tensor.dim() == 0:
        return 0
    return int(tensor.shape[0])
