"""The one slot of process-global state: the active session, the cached environment, ``use()``.

Rank getters read :func:`view`, which is cheap (no torch import when no process group can exist).
Collectives call :func:`session`, which returns the active session, adopts a process group
that someone else created, serves a world of one, or says to call :func:`unidist.initialize`.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from unidist import _env
from unidist.errors import NotInitializedError

if TYPE_CHECKING:
    from unidist._control import ControlPlane
    from unidist._env import EnvReading, Topology
    from unidist.adapters.base import Adapter

__all__ = ["Session", "reset", "session", "view"]


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
    #: Store-based waits with their own deadlines (None: waits are bounded by ``timeout``).
    plane: ControlPlane | None = None
    #: The process that created the session: process groups do not survive fork.
    pid: int = field(default_factory=os.getpid)


_lock = threading.RLock()
_session: Session | None = None
_serial: Session | None = None
_reading: EnvReading | None = None
#: Adapters selected with ``unidist.use(...)``, innermost last.
use_stack: list[Adapter] = []


def env_reading() -> EnvReading:
    """The environment, parsed once per process (re-read after fork and after :func:`reset`)."""
    global _reading
    reading = _reading
    if reading is None:
        reading = _reading = _env.read()
    return reading


def current() -> Session | None:
    """The explicit session, if :func:`unidist.initialize` ran (or adopted a group)."""
    return _session


def install(new: Session | None) -> None:
    """Make ``new`` the active session (``None`` clears it)."""
    global _session
    with _lock:
        _session = new


def torch_group_is_live() -> bool:
    """Whether a default torch process group exists, without importing torch."""
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def view() -> EnvReading:
    """What the rank getters report: the session's topology, else the live group, else the env."""
    active = _session
    if active is not None:
        return active.env
    reading = env_reading()
    if torch_group_is_live():
        return check_against_live_group(reading)
    return reading


def check_against_live_group(reading: EnvReading) -> EnvReading:
    import torch.distributed as dist

    from unidist.errors import TopologyError

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


def session(what: str) -> Session:
    """The session a collective should use.

    Args:
        what: the operation, for the error message.

    Raises:
        NotInitializedError: several processes are expected but no process group exists.
    """
    active = _session
    if active is not None:
        if active.pid != os.getpid():
            raise NotInitializedError(
                f"{what} was called in a forked child (pid {os.getpid()}, e.g. a DataLoader "
                f"worker) of rank {active.topology.rank}; process groups do not survive fork. "
                "HINT: run collectives in the training process, not in workers."
            )
        return active
    if torch_group_is_live():
        from unidist import lifecycle

        lifecycle.initialize()  # adopt the group someone else created; every rank is here too
        assert _session is not None
        return _session
    reading = env_reading()
    if reading.world_size == 1:
        return _serial_session(reading)
    raise NotInitializedError(
        f"{what} needs a process group: the environment says world size {reading.world_size} "
        f"({reading.launcher}), but none has been initialized. HINT: call unidist.initialize() "
        "on every rank before the first collective."
    )


def _serial_session(reading: EnvReading) -> Session:
    global _serial
    serial = _serial
    if serial is None or serial.env is not reading:
        from unidist.adapters import registry

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
    """Forget everything: session, cached environment, ``use()`` stack (tests)."""
    global _session, _serial, _reading
    with _lock:
        _session = None
        _serial = None
        _reading = None
        use_stack.clear()


def _after_fork_in_child() -> None:
    # Re-read the environment (Ignite's fork-started ranks set it after forking). The session is
    # kept so getters still work in DataLoader workers; session() refuses collectives there.
    global _serial, _reading
    _serial = None
    _reading = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
