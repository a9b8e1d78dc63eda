"""Starting, adopting, inspecting and stopping the process group."""

from __future__ import annotations

import contextlib
import gc
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING

from unidist import _env, _state
from unidist._workarounds import GLOO_TEARDOWN_DEADLOCK
from unidist.adapters import registry
from unidist.errors import ConfigurationError, TopologyError, translate_errors

if TYPE_CHECKING:
    from unidist._control import ControlPlane
    from unidist._env import EnvReading, Topology
    from unidist._state import Session
    from unidist.adapters.base import Adapter

__all__ = [
    "DEFAULT_TIMEOUT",
    "available_adapters",
    "available_backends",
    "backend",
    "current_adapter",
    "finalize",
    "initialize",
    "is_initialized",
    "use",
]

#: Seconds a collective may wait before it fails (``UNIDIST_TIMEOUT`` overrides it).
DEFAULT_TIMEOUT = 300.0
#: How long finalize lets gloo's worker threads drop their last tensors (see _release_gil_briefly).
_GLOO_DRAIN_SECONDS = 0.1


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
    with _state._lock:
        active = _state.current()
        if active is not None:
            _check_same(active, backend, adapter)
            return active.topology
        settings = _env.read_settings()
        reading = _env.read()
        seconds = _seconds(timeout, settings.timeout)
        chosen, reason = registry.choose(adapter, settings.adapter, reading)
        live = _state.torch_group_is_live()
        name = _resolve_backend(backend, reading, live)
        span = timedelta(seconds=seconds)
        if name is None:  # one process, nothing asked for: no process group at all
            session = _state.Session(chosen, None, reading.topology(), reading, span, reason=reason)
            _state.install(session)
            return session.topology
        if name == "nccl" and not live and reading.local_rank is not None:
            from unidist.devices import local_cuda_device

            local_cuda_device(reading.local_rank)  # NCCL binds to the current device
        what = f"starting the {chosen.name!r} adapter ({name}, world size {reading.world_size})"
        with translate_errors(what):
            owns = chosen.initialize(name, timeout=span, env=reading)
        session = _state.Session(
            chosen,
            name,
            reading.topology() if not reading.missing else _placeholder(reading),
            reading,
            span,
            owns_group=owns,
            reason=reason,
            torch_backed=_state.torch_group_is_live(),
        )
        _state.install(session)
        try:
            _settle(session)
        except BaseException:
            finalize()
            raise
        return session.topology


def _seconds(timeout: float | timedelta | None, from_env: float | None) -> float:
    if timeout is None:
        return from_env if from_env is not None else DEFAULT_TIMEOUT
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if not isinstance(seconds, int | float) or not seconds > 0:
        raise ConfigurationError(
            f"timeout={timeout!r} must be a positive number of seconds or a timedelta."
        )
    return float(seconds)


def _check_same(active: Session, backend: str | None, adapter: str | Adapter | None) -> None:
    wanted = adapter if isinstance(adapter, str) or adapter is None else adapter.name
    if backend is not None and backend != active.backend:
        raise ConfigurationError(
            f"unidist is already initialized with backend {active.backend!r}; initialize("
            f"backend={backend!r}) cannot switch it. HINT: call unidist.finalize() first, or "
            "drop the backend argument."
        )
    if wanted is not None and wanted != active.adapter.name:
        raise ConfigurationError(
            f"unidist is already initialized with the {active.adapter.name!r} adapter; "
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
        from unidist.devices import default_backend

        return default_backend()  # the backend of the device device("auto") picks
    from unidist.devices import require_backend

    require_backend(requested)
    return requested


def _placeholder(reading: EnvReading) -> Topology:
    """Rank and world size only, until _settle works out the rest from the other ranks."""
    return _env.Topology(
        rank=reading.rank, world_size=reading.world_size, launcher=reading.launcher
    )


def _settle(session: Session) -> None:
    """Cross-check the live group, open the control group, fill in and verify the topology."""
    reading = session.env
    if session.torch_backed:
        reading = _state.check_against_live_group(reading)
        session.env = reading
        if session.backend != "gloo" and reading.world_size > 1:
            import torch.distributed as dist

            with translate_errors("creating unidist's gloo control group"):
                session.control = dist.new_group(backend="gloo", timeout=session.timeout)
    if session.torch_backed and reading.world_size > 1:
        session.plane = _start_control_plane(session, reading)
    topology = _survey(session, reading) if reading.world_size > 1 else reading.topology()
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


def _start_control_plane(session: Session, reading: EnvReading) -> ControlPlane:
    """Rank 0 hosts unidist's control store on a free port; the others connect (collective)."""
    from unidist import collectives
    from unidist._control import ControlPlane

    host = reading.master_addr or collectives.broadcast_object(socket.gethostname())
    with translate_errors("starting unidist's control store"):
        return ControlPlane.start(
            host,
            reading.rank,
            reading.world_size,
            session.timeout,
            lambda port: collectives.broadcast_object(port, src=0),
        )


def _survey(session: Session, reading: EnvReading) -> Topology:
    """Gather (host, node, local rank) from every rank to fill gaps and catch collisions."""
    from unidist import collectives

    me = (socket.gethostname(), reading.node_rank, reading.local_rank, reading.local_world_size)
    everyone: list[tuple[str, int | None, int | None, int | None]] = collectives.all_gather_object(
        me
    )
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
    return topology


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
    active = _state.current()
    if active is None:
        return
    try:
        if active.torch_backed and GLOO_TEARDOWN_DEADLOCK.present():
            _release_gil_briefly()
            if not active.owns_group and active.control is not None:
                import torch.distributed as dist

                dist.destroy_process_group(active.control)
        active.adapter.finalize()
    finally:
        _state.install(None)


def _release_gil_briefly() -> None:
    """Let gloo's worker threads finish before its process group is destroyed (torch < 2.8).

    torch < 2.8's ``ProcessGroupGloo`` destructor joins its worker threads while holding the GIL
    (fixed by pytorch PR #154976, first released in 2.8; see :mod:`unidist._workarounds`). A
    worker that is still releasing a finished collective may drop the last reference to a tensor
    whose Python object it must free, which needs the GIL: a deadlock. Sleeping releases the GIL,
    so those workers finish first.
    """
    gc.collect()
    time.sleep(_GLOO_DRAIN_SECONDS)


def is_initialized() -> bool:
    """Whether :func:`initialize` has run in this process (and :func:`finalize` has not)."""
    active = _state.current()
    return active is not None and active.explicit


def backend() -> str | None:
    """The process-group backend in use (``gloo``, ``nccl``, ...), None without a process group."""
    active = _state.current()
    if active is not None:
        return active.backend
    if _state.torch_group_is_live():
        import torch.distributed as dist

        return str(dist.get_backend())
    return None


def available_backends() -> tuple[str, ...]:
    """Process-group backends this torch build provides (``gloo``, ``nccl``, ``mpi``, ...).

    Built-in backends count when torch was compiled with them (``nccl`` on a CUDA build even
    without a GPU: :func:`unidist.probe` says whether devices are present); backends that a
    plugin registered with ``torch.distributed.Backend.register_backend`` (``hccl`` once
    ``habana_frameworks`` is imported, ``xla`` once ``torch_xla`` is) count too.
    """
    import torch.distributed as dist

    if not dist.is_available():
        return ()
    checks = {
        "gloo": "is_gloo_available",
        "nccl": "is_nccl_available",
        "mpi": "is_mpi_available",
        "ucc": "is_ucc_available",
        "xccl": "is_xccl_available",
    }
    built = [name for name, check in checks.items() if getattr(dist, check, lambda: False)()]
    # "fake" (which newer torch registers for its own tests) moves no data: not a real backend.
    plugins = [
        name
        for name in dist.Backend.backend_list
        if name not in checks and name not in (dist.Backend.UNDEFINED, "fake")
    ]
    return (*built, *plugins)


def available_adapters() -> tuple[str, ...]:
    """Names of the adapters whose framework is installed."""
    return registry.available()


def current_adapter() -> Adapter:
    """The adapter collectives go through now (``serial`` in a single process)."""
    active = _state.current()
    if active is not None:
        return active.adapter
    return _state.session("current_adapter").adapter


@contextlib.contextmanager
def use(adapter: str | Adapter) -> Iterator[Adapter]:
    """Route collectives through another adapter for the duration of the block.

    The adapter adopts the running process group (for Ignite this is collective: call ``use`` on
    every rank). Useful to compare frameworks, or to let a framework-specific helper run inside a
    job started by another adapter.
    """
    session = _state.session("use")
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
