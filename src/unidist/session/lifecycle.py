"""Starting, adopting, inspecting and stopping the process group; finding the session.

:func:`initialize` builds a session completely (process group, control group and store, the
topology checked across ranks) before it publishes it in :mod:`unidist.session.state`, so no other
caller ever sees a half-built one; its cross-rank checks run on the unpublished session through
:mod:`unidist.session.transport`. :func:`session_for` is what every collective asks for a session:
the published one, a process group someone else started (adopted here), or a world of one.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING

from unidist._base.migration import foreign_keywords
from unidist.adapters import registry
from unidist.environments import places, variables as _env
from unidist.errors import (
    ConfigurationError,
    NotInitializedError,
    RemoteError,
    TopologyError,
    UnidistError,
    translate_errors,
)
from unidist.session import communicator, listen, state as _state, transport
from unidist.session.control import ControlPlane
from unidist.session.state import Session

if TYPE_CHECKING:
    from unidist.adapters.base import Adapter
    from unidist.environments.variables import EnvReading, Topology

__all__ = [
    "DEFAULT_TIMEOUT",
    "available_adapters",
    "backend",
    "current_adapter",
    "finalize",
    "initialize",
    "is_initialized",
    "session_for",
    "use",
]

#: Seconds a collective may wait before it fails (``UNIDIST_TIMEOUT`` overrides it).
DEFAULT_TIMEOUT = 300.0


#: Keywords of torch's ``init_process_group`` that Ignite's ``initialize(backend, **kwargs)``
#: passes on; unidist takes them from the launcher's environment instead.
INIT_KEYWORDS_FROM_ENV = (
    "init_method",
    "world_size",
    "rank",
    "store",
    "group_name",
    "pg_options",
    "device_id",
    "enable_reconfigure",  # newer torch (not in 2.7)
)
_FROM_ENV = (
    "ignite.distributed.initialize (for torch's init_process_group)",
    "unidist reads the rendezvous, rank and world size from the launcher's environment "
    "(MASTER_ADDR/MASTER_PORT, RANK, WORLD_SIZE): start the processes with `unidist launch`, "
    "torchrun or composer -n, and pass only backend= and timeout=",
)


@foreign_keywords(dict.fromkeys(INIT_KEYWORDS_FROM_ENV, _FROM_ENV))
def initialize(
    backend: str | None = None,
    *,
    adapter: str | Adapter | None = None,
    timeout: float | timedelta | None = None,
) -> Topology:
    """Start (or adopt) the process group; call it on every rank. Idempotent.

    Args:
        backend: ``gloo``, ``nccl``, ... ``None`` picks one: the live group's backend if there is
            one, no process group at all for a single process, ``nccl`` when CUDA devices are
            visible, else ``gloo``.
        adapter: ``torch``, ``composer``, ``ignite``, a registered name or an adapter object.
            ``None``: ``UNIDIST_ADAPTER``, else the framework this program uses, else ``torch``.
        timeout: seconds (or a timedelta) a collective may wait before failing. ``None``:
            ``UNIDIST_TIMEOUT``, else 300 s.

    Returns:
        This process's topology.

    Raises:
        ConfigurationError: an unknown or unavailable backend, or a second call that asks for a
            different backend or adapter than the running one.
        TopologyError: the environment is malformed or contradicts the process group.
        AdapterUnavailableError: the adapter's framework is not installed.
    """
    with _state.lock:
        session = _state.published()
        if session is not None:
            _check_same(session, backend, adapter)
            return session.topology
        session = _start(backend, adapter, timeout)
        _state.install(session)  # finished: only now can other callers see it
        return session.topology


def _start(
    backend: str | None, adapter: str | Adapter | None, timeout: float | timedelta | None
) -> Session:
    """Start (or adopt) the process group and build the whole session, without publishing it."""
    settings = _env.read_settings()
    try:
        reading = _env.read()
    except TopologyError:
        if not _state.torch_group_is_live():
            raise
        reading = _state.effective_reading()  # the live group fills a missing RANK, or raises
    if timeout is not None:
        seconds = _env.timeout_seconds(timeout)
    else:
        seconds = settings.timeout if settings.timeout is not None else DEFAULT_TIMEOUT
    chosen, reason = registry.choose(adapter, settings.adapter, reading)
    if chosen.environment is not None and not isinstance(chosen.environment, places.BUILT_IN):
        # A third-party adapter's environment joined the chooser when it was loaded: read
        # again, so that its variables are read as unidist.topology() reads them from now on.
        reading = _env.read()
    live = _state.torch_group_is_live()
    name = _resolve_backend(backend, reading, live)
    span = timedelta(seconds=seconds)
    if name is None:  # one process, nothing asked for: no process group at all
        return Session(chosen, None, reading.topology(), reading, span, reason=reason)
    if name == "nccl" and not live and reading.local_rank is not None:
        from unidist.session.devices import local_cuda_device

        local_cuda_device(reading.local_rank)  # NCCL binds to the current device
    what = f"starting the {chosen.name!r} adapter ({name}, world size {reading.world_size})"
    with translate_errors(what):
        owns = chosen.initialize(name, timeout=span, env=reading)
    session = Session(
        chosen,
        name,
        reading.topology() if not reading.missing else _placeholder(reading),
        reading,
        span,
        owns_group=owns,
        reason=reason,
        torch_backed=_state.torch_group_is_live(),
    )
    session.comm = communicator.choose(session)  # the control store joins it once started
    try:
        _complete(session)
    except BaseException:
        _teardown(session)
        raise
    return session


def _check_same(session: Session, backend: str | None, adapter: str | Adapter | None) -> None:
    wanted = adapter if isinstance(adapter, str) or adapter is None else adapter.name
    if backend is not None and backend != session.backend:
        raise ConfigurationError(
            f"unidist is already initialized with backend {session.backend!r}; initialize("
            f"backend={backend!r}) cannot switch it. HINT: call unidist.finalize() first, or "
            "drop the backend argument."
        )
    if wanted is not None and wanted != session.adapter.name:
        raise ConfigurationError(
            f"unidist is already initialized with the {session.adapter.name!r} adapter; "
            f"initialize(adapter={wanted!r}) cannot switch it. HINT: use unidist.use("
            f"{wanted!r}) for a block, or call unidist.finalize() first."
        )


def _resolve_backend(requested: str | None, reading: EnvReading, live: bool) -> str | None:
    if live:
        import torch.distributed as dist

        actual = str(dist.get_backend())
        if requested is not None and requested != actual:
            raise ConfigurationError(
                f"a process group with backend {actual!r} already exists, but backend="
                f"{requested!r} was asked for. HINT: drop the backend argument to adopt it."
            )
        return actual
    if requested is None:
        if reading.world_size == 1:
            return None
        from unidist.session.devices import default_backend

        return default_backend()  # the backend of the device device("auto") picks
    from unidist.session.devices import require_backend

    require_backend(requested)
    return requested


def _placeholder(reading: EnvReading) -> Topology:
    """Rank and world size only, until _complete works out the rest from the other ranks."""
    return _env.Topology(
        rank=reading.rank, world_size=reading.world_size, launcher=reading.launcher
    )


def _complete(session: Session) -> None:
    """Cross-check the live group, open the control group, fill in and verify the topology.

    Collective, on the session being built (not yet published): its messages go through
    :mod:`unidist.session.transport` with this session, not through the public collectives.
    """
    reading = session.env
    if session.torch_backed:
        reading = _state.check_against_live_group(reading)
        session.env = reading
        if session.backend != "gloo" and reading.world_size > 1:
            import torch.distributed as dist

            with translate_errors("creating unidist's gloo control group"):
                session.control = dist.new_group(backend="gloo", timeout=session.timeout)
    topology, one_host = (
        _survey(session, reading) if reading.world_size > 1 else (reading.topology(), True)
    )
    if session.torch_backed and reading.world_size > 1:
        session.comm = communicator.choose(
            session, _start_control_plane(session, reading, one_host)
        )
    view = session.adapter.topology(topology)
    mismatched = [
        f"{name}: {getattr(view, name)} (adapter) vs {getattr(topology, name)} (unidist)"
        for name in (
            "rank",
            "world_size",
            "local_rank",
            "local_world_size",
            "node_rank",
            "num_nodes",
        )
        if getattr(view, name) != getattr(topology, name)
    ]
    if mismatched:
        raise TopologyError(
            f"the {session.adapter.name!r} adapter disagrees with the launcher environment: "
            f"{'; '.join(mismatched)}. HINT: the launcher variables are inconsistent; run "
            "`unidist config` on each rank to see what each one reads."
        )
    topology = replace(topology, launcher=view.launcher)
    session.topology = topology
    session.env = reading.with_topology(topology, "topology verified across ranks")


def _start_control_plane(session: Session, reading: EnvReading, one_host: bool) -> ControlPlane:
    """Rank 0 hosts unidist's control store; the others connect (collective).

    It listens on loopback when every rank runs on one host, else on the address the rendezvous
    already uses (``MASTER_ADDR``), never on every interface. Its address, port and the job's
    secret reach the other ranks over the process group, as plain bytes.
    """

    def from_rank_zero(message: bytes | None) -> bytes:
        what = "sharing unidist's control store"
        world = reading.world_size
        return transport.broadcast_bytes(session, message, 0, world, session.control, what)

    hosts = listen.LOOPBACK if one_host else (reading.master_addr or socket.gethostname(),)
    failed: UnidistError | None = None
    try:
        with translate_errors("starting unidist's control store"):
            plane = ControlPlane.start(reading.rank, session.timeout, hosts, from_rank_zero)
    except UnidistError as exc:
        if reading.rank == 0:
            raise  # the others learned it from the start message and fail too
        failed = exc
    # Nobody leaves until every rank is connected: rank 0 hosts the store, and had it returned
    # (and exited) first, a rank still connecting would wait out the whole session timeout.
    mine = None if failed is None else f"{type(failed).__name__}: {failed}"
    try:
        everyone = transport.gather_object(session, mine, reading.world_size, session.control)
    except UnidistError:
        if failed is not None:
            raise failed from None  # this rank's own reason is the better one
        raise
    if failed is not None:
        raise failed
    refused = {rank: reason for rank, reason in enumerate(everyone) if reason is not None}
    if refused:
        raise RemoteError(
            f"rank(s) {sorted(refused)} could not connect to unidist's control store "
            f"(rank {min(refused)}: {refused[min(refused)]}). HINT: see those ranks' logs."
        )
    return plane


def _survey(session: Session, reading: EnvReading) -> tuple[Topology, bool]:
    """Gather (host, node, local rank) from every rank to fill gaps and catch collisions.

    Returns:
        The topology, and whether every rank runs on one host.
    """
    me = (socket.gethostname(), reading.node_rank, reading.local_rank, reading.local_world_size)
    everyone = transport.gather_object(session, me, reading.world_size, session.control)
    keys = [(host, node) for host, node, _, _ in everyone]
    node_order = list(dict.fromkeys(keys))
    mine = keys[reading.rank]
    same_node = [rank for rank, key in enumerate(keys) if key == mine]
    derived_local = same_node.index(reading.rank)
    given_nodes = reading.node_rank is not None
    topology = _env.Topology(
        rank=reading.rank,
        world_size=reading.world_size,
        local_rank=reading.local_rank if reading.local_rank is not None else derived_local,
        local_world_size=(
            reading.local_world_size if reading.local_world_size is not None else len(same_node)
        ),
        node_rank=(reading.node_rank if reading.node_rank is not None else node_order.index(mine)),
        num_nodes=(
            reading.num_nodes
            if reading.num_nodes is not None
            else len({node for _, node in node_order})
            if given_nodes
            else len(node_order)
        ),
        launcher=reading.launcher,
    )
    _check_collisions(everyone, topology, keys)
    return topology, len({host for host, _, _, _ in everyone}) == 1


def _check_collisions(
    everyone: list[tuple[str, int | None, int | None, int | None]],
    topology: Topology,
    keys: list[tuple[str, int | None]],
) -> None:
    seen: dict[tuple[tuple[str, int | None], int], int] = {}
    for rank, (_, _, local, _) in enumerate(everyone):
        if local is None:
            continue
        slot = (keys[rank], local)
        if slot in seen:
            raise TopologyError(
                f"ranks {seen[slot]} and {rank} both say they are local rank {local} on host "
                f"{keys[rank][0]!r} (node {keys[rank][1]}); two processes would share one slot "
                "(and one GPU). HINT: the launcher's LOCAL_RANK is wrong, e.g. torchrun started "
                "inside an srun step with several tasks per node."
            )
        seen[slot] = rank
    count = sum(1 for key in keys if key == keys[topology.rank])
    if topology.local_world_size != count:
        raise TopologyError(
            f"rank {topology.rank} reads local world size {topology.local_world_size}, but "
            f"{count} ranks run on host {keys[topology.rank][0]!r} (node "
            f"{keys[topology.rank][1]}). HINT: LOCAL_WORLD_SIZE or the node assignment is wrong."
        )


def finalize() -> None:
    """Stop the session; destroy the process group only if unidist created it. Never hangs.

    Safe to call twice, on any rank independently (it does not wait for the other ranks).
    """
    session = _state.published()
    if session is None:
        return
    try:
        _teardown(session)
    finally:
        _state.install(None)


def _teardown(session: Session) -> None:
    """Stop what ``session`` started: its control group, what the layers above keep for it
    (:func:`unidist.session.state.at_session_end`), and the process group if it owns it."""
    with _state.groups.closing():  # no other thread holds a group while they are destroyed
        session.comm.close()
        _state.session_ending()
        session.adapter.finalize()


def session_for(what: str) -> Session:
    """The session ``what`` (a collective, a wait) runs on.

    The published session; else a process group that someone else started, adopted here (every
    rank is in the same collective, so the adoption's own collectives line up); else, for one
    process, the implicit world of one.

    Raises:
        NotInitializedError: several processes are expected but no process group exists, or the
            caller is a forked child (a DataLoader worker) of a rank.
    """
    session = _state.published()
    if session is not None:
        if session.pid != _state.pid():  # a forked child (no system call: every collective)
            raise NotInitializedError(
                f"{what} was called in a forked child (pid {os.getpid()}, e.g. a DataLoader "
                f"worker) of rank {session.topology.rank}; process groups do not survive fork. "
                "HINT: run collectives in the training process, not in workers."
            )
        return session
    if _state.torch_group_is_live():
        initialize()  # adopt the group someone else created; every rank is here too
        session = _state.published()
        assert session is not None
        return session
    reading = _state.env_reading()
    if reading.world_size == 1:
        return _state.serial_session(reading)
    raise NotInitializedError(
        f"{what} needs a process group: the environment says world size {reading.world_size} "
        f"({reading.launcher}), but none has been initialized. HINT: call unidist.initialize() "
        "on every rank before the first collective."
    )


def is_initialized() -> bool:
    """Whether :func:`initialize` has run in this process (and :func:`finalize` has not)."""
    session = _state.published()
    return session is not None and session.explicit


def backend() -> str | None:
    """The process-group backend in use (``gloo``, ``nccl``, ...), None without a process group."""
    session = _state.published()
    if session is not None:
        return session.backend
    if _state.torch_group_is_live():
        import torch.distributed as dist

        return str(dist.get_backend())
    return None


def available_adapters() -> tuple[str, ...]:
    """Names of the adapters whose framework is installed."""
    return registry.available()


def current_adapter() -> Adapter:
    """The adapter collectives go through now (``serial`` in a single process)."""
    session = _state.published()
    if session is not None:
        return session.adapter
    return session_for("current_adapter").adapter


@contextlib.contextmanager
def use(adapter: str | Adapter) -> Iterator[Adapter]:
    """Route collectives through another adapter for the duration of the block.

    The adapter adopts the running process group (for Ignite this is collective: call ``use`` on
    every rank). Useful to compare frameworks, or to let a framework-specific helper run inside a
    job started by another adapter.
    """
    session = session_for("use")
    chosen, _ = registry.choose(adapter, None, session.env)
    if session.backend is not None and chosen is not session.adapter:
        with translate_errors(f"adopting the process group with the {chosen.name!r} adapter"):
            chosen.initialize(session.backend, timeout=session.timeout, env=session.env)
    previous = session.adapter
    session.adapter = chosen
    try:
        yield chosen
    finally:
        session.adapter = previous
