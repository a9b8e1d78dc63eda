"""The microbatch size: where it starts, how it shrinks and grows, and its history.

Every rank holds a :class:`SizeTracker` and feeds it the same tallies of votes in the same
order, so every rank reaches the same size without another exchange. A :class:`SizePolicy` must
therefore be a pure function of its arguments (no randomness, no per-rank state).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from unidist._microbatch.tally import Tally
from unidist.errors import ConfigurationError, MicrobatchOOMError

__all__ = ["SizeChange", "SizePolicy", "SizeTracker"]


@dataclass(frozen=True)
class SizeChange:
    """One change of the microbatch size.

    Attributes:
        step: the step (batch) during which the change was decided, counted from 0: a shrink
            on the first batch and the first batch's size found to fit both say ``step=0``.
        old: the size before (None: not yet known, the first batch ran whole).
        new: the size after.
        reason: why, in words.
    """

    step: int
    old: int | None
    new: int
    reason: str


@dataclass
class SizePolicy:
    """How the microbatch size starts, shrinks and grows. Subclass to change the rules.

    Attributes:
        start: the first size; None starts at the batch size of the first step.
        minimum: the smallest size; an OOM there raises :class:`~unidist.MicrobatchOOMError`.
        grow_after: after this many clean steps below the batch size, try a larger size (one
            probe; if it runs out of memory, the size goes back and the wait doubles). None
            never grows.
    """

    start: int | None = None
    minimum: int = 1
    grow_after: int | None = None

    def __post_init__(self) -> None:
        if not _positive_int(self.minimum):
            raise ConfigurationError(f"SizePolicy(minimum={self.minimum!r}) must be an int >= 1.")
        if self.start is not None and not (
            _positive_int(self.start) and self.start >= self.minimum
        ):
            raise ConfigurationError(
                f"SizePolicy(start={self.start!r}) must be None (the batch size) or an int >= "
                f"minimum ({self.minimum})."
            )
        if self.grow_after is not None and not _positive_int(self.grow_after):
            raise ConfigurationError(
                f"SizePolicy(grow_after={self.grow_after!r}) must be None (never grow) or an "
                "int >= 1 (clean steps before trying a larger size)."
            )

    def shrink(self, size: int, failures: int) -> int:
        """The next size after an OOM at ``size``; ``failures`` counts the OOMs in this step.

        The default halves. It must return an int smaller than ``size`` (it is raised to
        ``minimum`` if below it).
        """
        return size // 2

    def grow(self, size: int) -> int:
        """The size to probe after ``grow_after`` clean steps; the default doubles."""
        return size * 2


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass
class SizeTracker:
    """The agreed size and its history; changed only from votes, identically on every rank."""

    policy: SizePolicy
    logger: logging.Logger
    size: int | None = None
    history: list[SizeChange] = field(default_factory=list)
    retries: int = 0
    steps: int = 0
    _clean: int = 0
    _wait: int = 0
    _probe_from: int | None = None
    _ceiling: int = 0
    #: Whether the step in progress had an OOM (then it is not a clean step).
    _troubled: bool = False

    def __post_init__(self) -> None:
        self.size = self.policy.start
        self._wait = self.policy.grow_after or 0

    def effective(self, total: int) -> int:
        """The size this rank uses for a batch of ``total`` samples."""
        return min(self.size if self.size is not None else total, total)

    def failed(self, tally: Tally, failures: int) -> None:
        """Shrink after an attempt in which some rank ran out of memory.

        Raises:
            MicrobatchOOMError: the size is already the minimum.
            ConfigurationError: the policy returned an unusable size.
        """
        self._clean = 0
        self._troubled = True
        if self.size is None:  # the first attempt ran at each rank's batch size
            self.size = tally.size
        basis = tally.oom_basis
        if basis is None:  # only aborted attempts: nothing learned, try again as is
            self.retries += 1
            return
        who = tally.describe(tally.oom_ranks)
        probe, self._probe_from = self._probe_from, None
        if probe is not None and basis > probe:
            self._wait *= 2
            reason = (
                f"the probe at {basis} ran out of memory ({who}); back to {probe}, next probe "
                f"after {self._wait} clean steps"
            )
            self._change(probe, reason, logging.INFO)
        elif basis <= self.policy.minimum:
            hint = "lower SizePolicy.minimum, or " if self.policy.minimum > 1 else ""
            raise MicrobatchOOMError(
                f"out of memory with microbatch size {basis}, the minimum (SizePolicy.minimum="
                f"{self.policy.minimum}), at step {self.steps}: {who}. Every rank raises this "
                f"error. HINT: {hint}make one microbatch fit: shorter sequences, mixed precision "
                "(torch.autocast), activation checkpointing, a sharded model (FSDP), or less "
                "memory held elsewhere (other processes on the device, tensors kept from earlier "
                "steps)."
            )
        else:
            new = self._checked(self.policy.shrink(basis, failures), basis, "shrink", smaller=True)
            new = max(new, self.policy.minimum)
            self._change(new, f"out of memory at {basis} ({who})", logging.WARNING)
        self.retries += 1

    def succeeded(self, tally: Tally) -> None:
        """Record a step that every rank finished; maybe start probing a larger size."""
        step = self.steps  # the step that finished: what its changes are recorded under
        self.steps += 1
        troubled, self._troubled = self._troubled, False
        if tally.used_size is None:  # no rank had a sample
            return
        self._ceiling = max(self._ceiling, tally.ceiling)
        if self.size is None:
            self._change(
                tally.used_size, "the batch size of the first step fits", logging.INFO, step
            )
        assert self.size is not None
        if self._probe_from is not None:
            self.logger.info("microbatch size %d: the probe succeeded", self.size)
            self._probe_from = None
            self._wait = self.policy.grow_after or 0
        if self.policy.grow_after is None or self.size >= self._ceiling or troubled:
            return
        self._clean += 1
        if self._clean >= self._wait:
            grown = self._checked(self.policy.grow(self.size), self.size, "grow", smaller=False)
            new = min(grown, self._ceiling)
            self._probe_from = self.size
            self._change(new, f"probing after {self._clean} clean steps", logging.INFO, step)
            self._clean = 0

    def _checked(self, value: object, size: int, method: str, *, smaller: bool) -> int:
        if not isinstance(value, int) or not _positive_int(value):
            value_ok = False
        else:
            value_ok = value < size if smaller else value > size
        if not value_ok:
            relation = "smaller" if smaller else "larger"
            raise ConfigurationError(
                f"{type(self.policy).__name__}.{method}({size}, ...) returned {value!r}; it must "
                f"return a positive int {relation} than {size}. HINT: fix the policy's {method}()."
            )
        assert isinstance(value, int)
        return value

    def _change(self, new: int, reason: str, level: int, step: int | None = None) -> None:
        step = self.steps if step is None else step
        self.history.append(SizeChange(step, self.size, new, reason))
        self.logger.log(level, "microbatch size %s -> %d: %s", self.size, new, reason)
        self.size = new

    def state_dict(self) -> dict[str, Any]:
        """The search state, to save in a checkpoint."""
        return {
            "size": self.size,
            "clean": self._clean,
            "wait": self._wait,
            "probe_from": self._probe_from,
            "ceiling": self._ceiling,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s result."""
        size = state.get("size")
        if size is not None and not _positive_int(size):
            raise ConfigurationError(f"a saved microbatch size must be an int >= 1, got {size!r}.")
        self.size = size
        self._clean = int(state.get("clean", 0))
        self._wait = int(state.get("wait", self.policy.grow_after or 0))
        self._probe_from = state.get("probe_from")
        self._ceiling = int(state.get("ceiling", 0))
