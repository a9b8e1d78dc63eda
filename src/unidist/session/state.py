"""The one slot of process-global state: the active session and the cached environment.

Only the slot: :func:`install` publishes a finished session (:func:`unidist.initialize` builds it
first), :func:`published` reads it, :func:`reset` forgets everything (tests); what the layers
above keep per session ends with it through :func:`at_session_end`. Rank getters read
:func:`effective_reading`, which is cheap (no torch import when no process group can exist). Finding
the session a collective runs on, adopting a process group that someone else created, is
:func:`unidist.session.lifecycle.session_for`, one layer up: this module calls nothing above it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from unidist.adapters import registry
from unidist.environments import variables as _env
from unidist.errors import TopologyError
from unidist.session.communicator import Communicator, SerialCommunicator

if TYPE_CHECKING:
    from unidist.adapters.base import Adapter
    from unidist.environments.variables import EnvReading, Topology

__all__ = [
    "Session",
    "at_session_end",
    "check_against_live_group",
    "GroupGuard",
    "effective_reading",
    "env_reading",
    "groups",
    "install",
    "lock",
    "published",
    "reset",
    "serial_session",
    "session_ending",
    "torch_group_is_live",
]


@dataclass
class Session:
    """A live unidist session: which adapter, which backend, who owns the process group."""

    adapter: Adapter
    backend: str | None
    topology: Topology
    env: EnvReading
    timeout: timedelta
    #: True when unidist created the default process group (so finalize destroys it).
    owns_group: bool = False
    #: True when unidist.initialize() ran (False for the implicit world-of-one session).
    explicit: bool = True
    #: Why the adapter was chosen, for show_config.
    reason: str = ""
    #: Gloo group for control messages when the main backend is not gloo (None: use the world).
    control: Any = None
    #: Whether torch.distributed carries this session.
    torch_backed: bool = False
    #: Waits with deadlines, votes, flags and side groups (:mod:`unidist.session.communicator`),
    #: chosen once by :func:`unidist.initialize`; one process alone until then.
    comm: Communicator = field(default_factory=SerialCommunicator)
    #: The process that created the session: process groups do not survive fork.
    pid: int = field(default_factory=os.getpid)


#: Held while a session is started or published (re-entrant: start-up may adopt).
lock = threading.RLock()


class GroupGuard:
    """Keeps other threads from holding process-group objects while unidist destroys them.

    A group whose last reference another thread drops late outlives ``destroy_process_group``:
    its store keeps serving ``MASTER_PORT``, so the next ``init_process_group`` on rank 0 joins
    that old store (torch shares one server per port) and reads the last group's addresses, and
    the new group never forms; on torch < 2.8 the late drop can also run gloo's destructor on
    that thread, which deadlocks (:mod:`unidist._base.workarounds`). The hang page's stack
    thread reads the groups' sequence numbers from its own thread, so it takes the guard
    without blocking (:meth:`try_hold`) and skips a look when it cannot; unidist's teardown
    holds it (:meth:`closing`), and readers stand back as soon as a teardown asks, so it never
    starves.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closing = threading.Event()

    def try_hold(self) -> bool:
        """Hold the guard if no teardown wants it (never blocks); :meth:`release` after."""
        if self._closing.is_set():
            return False
        return self._lock.acquire(blocking=False)

    def release(self) -> None:
        self._lock.release()

    @contextlib.contextmanager
    def closing(self, seconds: float = 10.0) -> Iterator[None]:
        """Hold the guard while the groups are destroyed.

        Waits at most ``seconds`` for a reader to let go (one holds it for microseconds; the
        bound covers a reader starved of the GIL), then goes ahead regardless.
        """
        self._closing.set()
        held = self._lock.acquire(timeout=seconds)
        try:
            yield
        finally:
            self._closing.clear()
            if held:
                self._lock.release()


#: The one guard over this process's process-group objects (see :class:`GroupGuard`).
groups = GroupGuard()
_session: Session | None = None
_serial: Session | None = None
_reading: EnvReading | None = None
#: What runs when a session ends (:func:`at_session_end`), in the order registered.
_at_end: list[Callable[[], None]] = []


def env_reading() -> EnvReading:
    """The environment, parsed once per process (re-read after fork and after :func:`reset`)."""
    global _reading
    reading = _reading
    if reading is None:
        reading = _reading = _env.read()
    return reading


def published() -> Session | None:
    """The explicit session, if :func:`unidist.initialize` ran (or adopted a group)."""
    return _session


def install(new: Session | None) -> None:
    """Make ``new`` the active session (``None`` clears it); ``new`` must be finished."""
    global _session
    with lock:
        _session = new


def at_session_end(callback: Callable[[], None]) -> None:
    """Call ``callback()`` whenever a session ends, before the adapter ends the process group.

    For what a layer above keeps per session (``unidist.compat``'s groups made from lists of
    ranks), so that the core ends it without importing that layer. A callback must not raise;
    registering the same one again does nothing.
    """
    with lock:
        if callback not in _at_end:
            _at_end.append(callback)


def session_ending() -> None:
    """Run the :func:`at_session_end` callbacks (the teardown of ``unidist.finalize`` does)."""
    for callback in tuple(_at_end):
        callback()


def torch_group_is_live() -> bool:
    """Whether a default torch process group exists, without importing torch."""
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def effective_reading() -> EnvReading:
    """What the rank getters report: the session's topology, else the live group, else the env."""
    session = _session
    if session is not None:
        return session.env
    try:
        reading = env_reading()
    except TopologyError as exc:
        if not torch_group_is_live():
            raise
        # WORLD_SIZE without RANK (Ignite's tests start their groups so, rank given to
        # init_process_group): the live group knows the rank the variables left out.
        return _live_group_instead(exc)
    if torch_group_is_live():
        return check_against_live_group(reading)
    return reading


def _live_group_instead(exc: TopologyError) -> EnvReading:
    """The live group's rank and world size, when the variables' only fault is a missing RANK
    and their WORLD_SIZE agrees with the group; ``exc`` otherwise."""
    import torch.distributed as dist

    given = _env.chosen(("RANK", "WORLD_SIZE"))
    world = given.get("WORLD_SIZE")
    if "RANK" in given or world != str(dist.get_world_size()):
        raise exc
    return _env.EnvReading(
        launcher="none",
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=None,
        local_world_size=None,
        node_rank=None,
        num_nodes=None,
        notes=(f"rank from the live process group (WORLD_SIZE={world} is set, RANK is not)",),
    )


def check_against_live_group(reading: EnvReading) -> EnvReading:
    """``reading``, checked against (or, without launcher variables, filled from) the live group."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    if reading.launcher == "none":
        if world == 1:
            return reading
        # Someone called init_process_group(rank=..., world_size=...) without launcher variables.
        return _env.EnvReading(
            launcher="none",
            rank=rank,
            world_size=world,
            local_rank=None,
            local_world_size=None,
            node_rank=None,
            num_nodes=None,
            notes=(*reading.notes, "rank and world size from the live process group"),
        )
    if (reading.rank, reading.world_size) != (rank, world):
        raise TopologyError(
            f"the environment says {reading.sources.get('rank', 'RANK')}={reading.rank} and "
            f"{reading.sources.get('world_size', 'WORLD_SIZE')}={reading.world_size}, but the live "
            f"process group says rank {rank} of {world}. HINT: do not change these variables "
            "after the process group starts, and do not start a group with explicit rank or "
            "world_size that contradict the launcher."
        )
    return reading


def serial_session(reading: EnvReading) -> Session:
    """The implicit world-of-one session for ``reading`` (kept until the environment is re-read)."""
    global _serial
    serial = _serial
    if serial is None or serial.env is not reading:
        serial = _serial = Session(
            adapter=registry.get("serial"),
            backend=None,
            topology=reading.topology(),
            env=reading,
            timeout=timedelta(seconds=0),
            explicit=False,
            reason="one process and no process group",
        )
    return serial


def reset() -> None:
    """Forget everything: session and cached environment (tests)."""
    global _session, _serial, _reading
    with lock:
        _session = None
        _serial = None
        _reading = None


def pid() -> int:
    """This process's id, without a system call (kept by the fork hook below)."""
    return _pid


_pid = os.getpid()


def _after_fork_in_child() -> None:
    # Re-read the environment (Ignite's fork-started ranks set it after forking). The session is
    # kept so getters still work in DataLoader workers; lifecycle.session_for() refuses
    # collectives there.
    global _serial, _reading, _pid
    _serial = None
    _reading = None
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
