"""One communicator per session: the waits, votes, flags and side groups above the collectives.

:func:`unidist.initialize` chooses it once, when the session is complete, and keeps it on the
session (``session.comm``); everything above (:mod:`unidist.collectives.sync`, the one-rank
helpers, the microbatch vote, :class:`unidist.ResumableState`'s stop vote, subgroups, the
model wrappers) calls it and never asks which one it holds:

* :class:`TorchCommunicator`: a torch process group; with several ranks, unidist's control
  store (:mod:`unidist.session.control`). Barriers with a deadline, agreements and exchanges are
  store waits that end on time and name the missing ranks; flags are store keys any rank looks
  at without waiting; background votes get a gloo group of their own.
* :class:`CollectiveCommunicator`: several ranks over an adapter that is not built on
  ``torch.distributed`` (a third-party framework). Agreements and exchanges travel as JSON
  bytes through the adapter's own gather (:mod:`unidist.session.transport`: down, never back up
  through the public collectives), with the same encoding and limits as over the store, so both
  give the same values; barriers are the adapter's, bounded by the session's timeout; there are
  no flags and no side groups (callers fall back to what one rank alone knows).
* :class:`SerialCommunicator`: one process. Nothing travels.

A communicator also knows what its teardown needs before the adapter ends the group
(:meth:`Communicator.close`) and whether torch's own wrappers (DDP, FSDP, tensor parallel) can
run on it (:meth:`Communicator.require_torch`).
"""

from __future__ import annotations

import atexit
import gc
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from unidist._base.workarounds import GLOO_EXIT_ABORT, GLOO_TEARDOWN_DEADLOCK
from unidist.errors import ConfigurationError, translate_errors
from unidist.session import transport
from unidist.session.control import ControlPlane, ExpectedValues
from unidist.session.wire import MAX_OUTCOME_BYTES, Json, decode_json, encode_json

if TYPE_CHECKING:
    import torch

    from unidist.adapters.base import PrimitiveOp

__all__ = [
    "CollectiveCommunicator",
    "Communicator",
    "ExpectedValues",
    "SideChannel",
    "Signal",
    "SerialCommunicator",
    "TorchCommunicator",
    "choose",
]

#: ``combine({rank: value, ...}) -> outcome`` of an agreement.
Combine = Callable[[dict[int, Json]], Json]
#: How long a teardown (torch < 2.8) or the exit (every torch) releases the GIL so that gloo's
#: worker threads drop their last tensors.
GLOO_DRAIN_SECONDS = 0.1


class CommunicatorView(transport.SessionView, Protocol):
    """What a communicator reads of the session it serves (:class:`unidist.session.state.Session`):
    what the transport reads, and more."""

    @property
    def timeout(self) -> timedelta: ...
    @property
    def control(self) -> Any: ...
    @property
    def owns_group(self) -> bool: ...
    @property
    def torch_backed(self) -> bool: ...


class Signal:
    """A flag any rank raises and every rank looks at without waiting.

    This base is the flag nobody else can see (one process, or no control store): it is never
    raised, and raising or lowering it does nothing; :attr:`usable` says so.
    """

    usable = False

    def raise_flag(self) -> None:
        """Raise the flag (visible to every rank at once; it never waits)."""

    def is_raised(self) -> bool:
        """Whether some rank raised the flag (never waits)."""
        return False

    def lower(self) -> None:
        """Delete the flag (once no rank can still be looking at it)."""


class _StoreSignal(Signal):
    usable = True

    def __init__(self, plane: ControlPlane, name: str) -> None:
        self._plane = plane
        self._name = name

    def raise_flag(self) -> None:
        self._plane.raise_flag(self._name)

    def is_raised(self) -> bool:
        return self._plane.flag_is_raised(self._name)

    def lower(self) -> None:
        self._plane.lower_flag(self._name)


class SideChannel:
    """A gloo group of the whole world for small background votes, beside the training's.

    CPU tensors on a group of their own: on GPUs a vote neither synchronises a stream nor
    queues behind NCCL work, and with gloo training it does not queue in front of DDP's
    gradient reductions (a group runs its collectives one after another).
    """

    def __init__(self, group: Any) -> None:
        self._group = group

    def max(self, tensor: torch.Tensor) -> None:
        """Every rank's elementwise maximum, in place, now."""
        import torch.distributed as dist

        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self._group)

    def max_started(self, tensor: torch.Tensor) -> Any:
        """The same, started: the result is in ``tensor`` once the returned work's ``wait()``
        returns."""
        import torch.distributed as dist

        return dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self._group, async_op=True)


class Communicator:
    """The interface; see the module's docstring for the three kinds."""

    #: Short name for messages: ``torch``, ``collectives`` or ``serial``.
    kind: str = ""
    #: unidist's control store where there is one (tests and benchmarks look at it).
    plane: ControlPlane | None = None

    # -- the primitives: every collective of unidist reaches the adapter through these --------
    # (only with several ranks: the world of one is answered above, in unidist.session.transport)

    def all_reduce(self, tensor: torch.Tensor, op: PrimitiveOp, handle: Any) -> torch.Tensor:
        """``tensor`` reduced with ``op`` across the group ``handle`` (None: the world)."""
        raise NotImplementedError

    def all_gather(self, tensor: torch.Tensor, handle: Any) -> list[torch.Tensor]:
        """One same-shaped tensor per rank of the group, in group-rank order."""
        raise NotImplementedError

    def broadcast(self, tensor: torch.Tensor, src: int, handle: Any) -> torch.Tensor:
        """Global rank ``src``'s ``tensor`` on every rank of the group."""
        raise NotImplementedError

    def new_group(self, ranks: Sequence[int]) -> Any:
        """The handle of a new group of the global ``ranks`` (collective: every rank calls it)."""
        raise NotImplementedError

    def barrier(
        self, members: Sequence[int], handle: Any, seconds: float | None, what: str
    ) -> None:
        """Every rank of ``members`` (the group ``handle``, None: the world) arrives, or the
        wait ends after ``seconds`` with an error naming the ranks that did not; ``None``: the
        adapter's own barrier, bounded only by the process group's timeout."""
        raise NotImplementedError

    def agree(
        self,
        members: Sequence[int],
        value: Json,
        combine: Combine,
        seconds: float,
        what: str,
        expected: ExpectedValues | None = None,
    ) -> Json:
        """Every member contributes ``value``; every member gets ``combine`` of all of them
        (plain JSON data, never a pickle), within ``seconds``."""
        everyone = self._everyone(value, what)
        outcome = combine(dict(enumerate(everyone)))
        return decode_json(encode_json(outcome, what, MAX_OUTCOME_BYTES))

    def exchange(
        self,
        members: Sequence[int],
        value: Json,
        *,
        publish: bool,
        wait_for: Sequence[int],
        seconds: float,
        what: str,
    ) -> dict[int, Json]:
        """An agreement in which publishers send ``value`` and each rank reads ``wait_for``'s."""
        everyone = self._everyone(value if publish else None, what)
        return {rank: everyone[rank] for rank in wait_for}

    def _everyone(self, value: Json, what: str) -> list[Json]:
        """Every rank's ``value``, in rank order, through JSON (the store's checks and limits)."""
        raise NotImplementedError

    def signal(self, name: str) -> Signal:
        """The flag ``name`` (every rank builds it from the same name)."""
        return Signal()

    def side_channel(self, what: str) -> SideChannel | None:
        """A new :class:`SideChannel` for ``what`` (collective: every rank calls it at the same
        point), or None where there is none (one rank alone: its own value is the vote)."""
        return None

    def companion(self, ranks: Sequence[int]) -> Any | None:
        """The gloo group that carries control messages for a new subgroup of ``ranks``
        (collective), or None when the subgroup can carry them itself."""
        return None

    def require_torch(self, what: str) -> None:
        """Raise unless ``torch.distributed`` carries this session (DDP, FSDP and TP need it)."""

    def close(self) -> None:
        """What must happen before the adapter ends the process group."""


class SerialCommunicator(Communicator):
    """One process: every wait is over at once and every agreement is this rank's own."""

    kind = "serial"

    def all_reduce(self, tensor: torch.Tensor, op: PrimitiveOp, handle: Any) -> torch.Tensor:
        return tensor

    def all_gather(self, tensor: torch.Tensor, handle: Any) -> list[torch.Tensor]:
        return [tensor]

    def broadcast(self, tensor: torch.Tensor, src: int, handle: Any) -> torch.Tensor:
        return tensor

    def new_group(self, ranks: Sequence[int]) -> Any:
        return tuple(ranks)

    def barrier(
        self, members: Sequence[int], handle: Any, seconds: float | None, what: str
    ) -> None:
        return None

    def _everyone(self, value: Json, what: str) -> list[Json]:
        return [decode_json(encode_json(value, what))]  # the same checks and copies as with peers


class CollectiveCommunicator(Communicator):
    """Several ranks over an adapter's own primitives (no ``torch.distributed``, no store)."""

    kind = "collectives"

    def __init__(self, session: CommunicatorView) -> None:
        self._session = session

    # The session's adapter at the time of the call: unidist.use() lends it another for a block.

    def all_reduce(self, tensor: torch.Tensor, op: PrimitiveOp, handle: Any) -> torch.Tensor:
        return self._session.adapter.all_reduce(tensor, op, handle)

    def all_gather(self, tensor: torch.Tensor, handle: Any) -> list[torch.Tensor]:
        return self._session.adapter.all_gather(tensor, handle)

    def broadcast(self, tensor: torch.Tensor, src: int, handle: Any) -> torch.Tensor:
        return self._session.adapter.broadcast(tensor, src, handle)

    def new_group(self, ranks: Sequence[int]) -> Any:
        return self._session.adapter.new_group(ranks)

    def barrier(
        self, members: Sequence[int], handle: Any, seconds: float | None, what: str
    ) -> None:
        with translate_errors(what):
            self._session.adapter.barrier(handle)

    def require_torch(self, what: str) -> None:
        raise ConfigurationError(
            f"{what}: the {self._session.adapter.name!r} adapter does not run on "
            "torch.distributed, which DDP, FSDP and TP need. HINT: initialize with "
            "adapter='torch', 'composer' or 'ignite'."
        )

    def _everyone(self, value: Json, what: str) -> list[Json]:
        """Every rank's ``value`` as JSON bytes in a tensor, never a pickle (the store's limits)."""
        import torch

        session = self._session
        encoded = encode_json(value, what)
        world = session.topology.world_size
        if world == 1:
            return [decode_json(encoded)]
        data = torch.frombuffer(bytearray(encoded), dtype=torch.uint8)
        parts = transport.gather_uneven(session, data, world, None, session.control)
        return [decode_json(part.numpy().tobytes()) for part in parts]


class TorchCommunicator(CollectiveCommunicator):
    """A torch process group; with several ranks, unidist's control store (``plane``) too.

    Without a store (one rank, or while :func:`unidist.initialize` is still starting it) the
    waits are the collectives of :class:`CollectiveCommunicator`.
    """

    kind = "torch"

    def __init__(self, session: CommunicatorView, plane: ControlPlane | None) -> None:
        super().__init__(session)
        self.plane = plane  # None: one rank, or not started yet

    def barrier(
        self, members: Sequence[int], handle: Any, seconds: float | None, what: str
    ) -> None:
        if self.plane is None or seconds is None:
            super().barrier(members, handle, seconds, what)
        else:
            self.plane.barrier(tuple(members), seconds, what)

    def agree(
        self,
        members: Sequence[int],
        value: Json,
        combine: Combine,
        seconds: float,
        what: str,
        expected: ExpectedValues | None = None,
    ) -> Json:
        if self.plane is None:
            return super().agree(members, value, combine, seconds, what, expected)
        return self.plane.agree(tuple(members), value, combine, seconds, what, expected)

    def exchange(
        self,
        members: Sequence[int],
        value: Json,
        *,
        publish: bool,
        wait_for: Sequence[int],
        seconds: float,
        what: str,
    ) -> dict[int, Json]:
        if self.plane is None:
            return super().exchange(
                members, value, publish=publish, wait_for=wait_for, seconds=seconds, what=what
            )
        return self.plane.exchange(
            tuple(members), value, publish=publish, wait_for=wait_for, seconds=seconds, what=what
        )

    def signal(self, name: str) -> Signal:
        if self.plane is None:
            return Signal()
        return _StoreSignal(self.plane, name)

    def side_channel(self, what: str) -> SideChannel | None:
        if self._session.topology.world_size < 2:
            return None
        import torch.distributed as dist

        with translate_errors(f"creating the gloo group of {what}"):
            return SideChannel(dist.new_group(backend="gloo", timeout=self._session.timeout))

    def companion(self, ranks: Sequence[int]) -> Any | None:
        if self._session.backend == "gloo":
            return None
        import torch.distributed as dist

        return dist.new_group(ranks=list(ranks), backend="gloo", timeout=self._session.timeout)

    def require_torch(self, what: str) -> None:
        return None

    def close(self) -> None:
        close_torch_groups(self._session)


def close_torch_groups(session: CommunicatorView) -> None:
    """Before the adapter destroys the group, on torch < 2.8 (pytorch PR #154976).

    torch < 2.8's ``ProcessGroupGloo`` destructor joins its worker threads while holding the GIL
    (see :mod:`unidist._base.workarounds`). A worker that is still releasing a finished collective
    may drop the last reference to a tensor whose Python object it must free, which needs the
    GIL: a deadlock. Collecting garbage and sleeping briefly releases the GIL, so those workers
    finish first; unidist's control group, which the adapter does not know, goes the same way
    when the adapter keeps a group it did not create.
    """
    if not GLOO_TEARDOWN_DEADLOCK.present():
        return
    gc.collect()
    time.sleep(GLOO_DRAIN_SECONDS)
    if not session.owns_group and session.control is not None:
        import torch.distributed as dist

        dist.destroy_process_group(session.control)


def choose(session: CommunicatorView, plane: ControlPlane | None = None) -> Communicator:
    """The communicator of ``session`` (in ``initialize``: once the group exists, and again
    with the control store once it is started)."""
    if session.torch_backed:
        drain_gloo_at_exit()
        return TorchCommunicator(session, plane)
    if session.topology.world_size > 1:
        return CollectiveCommunicator(session)
    return SerialCommunicator()


_drain_registered = False


def drain_gloo_at_exit() -> None:
    """Let gloo's workers drop their last tensors before the interpreter finalizes (any torch).

    :data:`~unidist._base.workarounds.GLOO_EXIT_ABORT`: a gloo worker that finished a collective
    frees the Python objects of its tensors, which needs the GIL. The main thread, running
    Python, hands the GIL over only after the switch interval (5 ms), so a script that ends
    within a few milliseconds of its last collective (``unidist.finalize()``, a final barrier,
    a plain ``destroy_process_group()``) starts finalizing while the worker still waits; Python
    then ends that thread, and the unwinding through the work's destructor aborts the rank
    (SIGABRT after its work is done: the launcher reports the job failed). This registers, once,
    with the first torch-backed session, an exit handler that releases the GIL for
    :data:`GLOO_DRAIN_SECONDS`. Registered at ``initialize``, it runs after the exit handlers
    the script registers later (which may still use the group). Every torch release so far has
    the abort (2.7.0 included, though more rarely than 2.14), so the handler is registered on
    each.
    """
    global _drain_registered
    if _drain_registered or not GLOO_EXIT_ABORT.present():
        return
    _drain_registered = True
    atexit.register(time.sleep, GLOO_DRAIN_SECONDS)
