"""What runs inside every rank that ``unidist launch`` or :func:`unidist.spawn` starts.

Each rank leaves small JSON records in the run's event folder (``UNIDIST_EVENTS``): when it
started (pid, rank, host) and that it finished; why it failed goes to torch's error file
(``TORCHELASTIC_ERROR_FILE``, in torch's format: the exception, plus whether it was its own
fault or the consequence of another rank's failure). The launcher reads them to name the
culprit. Each rank also:

* dumps every thread's Python stack to its stderr log when it crashes in native code (a
  segmentation fault, an abort), or when the launcher stops it (SIGTERM or
  SIGINT) or asks for it (:data:`STACK_SIGNAL`, a real-time signal no script uses: SIGUSR1
  and SIGUSR2 stay free for schedulers, SLURM's ``--signal=USR1@90`` above all), so the report
  shows what a stopped rank was doing;
* dies at once on SIGINT from the launcher instead of waiting in a collective for a
  KeyboardInterrupt that cannot be delivered (a script's own signal handler still wins);
* asks Linux to kill it if the launcher itself dies (no orphans);
* keeps its progress record (``UNIDIST_PROGRESS``: a thread that says where the rank is, for the
  launcher's hang and straggler reports, :mod:`unidist.hangs`);
* exports ``NODE_RANK`` (torch's agent only sets ``GROUP_RANK``) for Composer's ``dist``;
* keeps room on the disk for its error file, written there when its log has filled the disk;
* works around the gloo destructor deadlock of torch < 2.8 (see :func:`_defer_group_destruction`)
  and gloo's abort at exit on later torch (see :func:`_end_open_groups`).

It imports nothing the script does not: the patches of torch wait until the script imports
``torch.distributed`` (:func:`when_imported`), so a rank whose program never imports torch
starts as fast as under torchrun.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib.abc
import importlib.machinery
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from unidist.launch import records

__all__ = [
    "STACK_SIGNAL",
    "default_start_method",
    "failure_kind",
    "die_with_parent",
    "prepare_rank",
    "record_done",
    "record_error",
    "when_imported",
]


#: The signal that asks a rank for every thread's stack (faulthandler answers it from inside any
#: C code): a real-time signal, so that SIGUSR1 and SIGUSR2 stay the script's and the
#: scheduler's. Sent to the rank's own pid, never its process group (DataLoader workers would
#: die of a real-time signal's default action).
STACK_SIGNAL: int = int(signal.SIGRTMIN) + 6 if hasattr(signal, "SIGRTMIN") else int(signal.SIGUSR1)


def _identity() -> dict[str, Any]:
    env = os.environ
    return {
        "rank": int(env.get("RANK", "0")),
        "local_rank": int(env.get("LOCAL_RANK", "0")),
        "node_rank": int(env.get("GROUP_RANK", env.get("NODE_RANK", "0"))),
        "world_size": int(env.get("WORLD_SIZE", "1")),
        "attempt": int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "pid": os.getpid(),
        "pid_start": records.process_start_time(os.getpid()),
        "host": socket.gethostname(),
    }


def _write(kind: str, payload: dict[str, Any]) -> None:
    records.write(kind, _identity(), payload)


def prepare_rank(python: bool = True) -> None:
    """Set up this rank: variables, signal handling, death with the parent; record the start.

    Args:
        python: the rank runs Python code here; False when it is about to ``exec`` a program
            (only what survives ``exec`` is set up: variables, death with the parent).
    """
    if "GROUP_RANK" in os.environ:
        os.environ.setdefault("NODE_RANK", os.environ["GROUP_RANK"])
    die_with_parent()
    if python:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        # A crash in native code (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) writes every
        # thread's Python stack to the rank's log before it dies: the report can say where.
        faulthandler.enable(all_threads=True)
        for sig in (signal.SIGTERM, signal.SIGINT):
            faulthandler.register(sig, all_threads=True, chain=True)
        faulthandler.register(STACK_SIGNAL, all_threads=True, chain=False)
        _defer_group_destruction()
        _end_open_groups()
        _prefix_store_by_attempt()
        _bind_group_store_to_master_addr()
        records.reserve()  # room for its error file, should its log fill the disk
        _record_progress()
    _write("start", {})


def _record_progress() -> None:
    """Start the thread that keeps this rank's progress record (hang and straggler reports)."""
    from unidist.environments import variables as _env

    path = _env.hang_page_file()
    if path:
        from unidist.hangs import stacks

        stacks.start(path)


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no orphans); elsewhere, nothing.

    Used by the launcher's ranks and by :func:`unidist.testing.run_distributed`'s.
    """
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def default_start_method() -> str:
    """The multiprocessing start method a fresh interpreter uses on this platform.

    A process started by the ``spawn`` or ``forkserver`` method inherits that method as its
    default, so its DataLoader workers would start as new interpreters that import torch again
    (seconds each); a script run by ``python`` (or ``unidist launch``) gets the platform's
    default (``fork`` on Linux up to Python 3.13). Python lists the default first.
    """
    import multiprocessing

    return multiprocessing.get_all_start_methods()[0]


def when_imported(name: str, patch: Callable[[ModuleType], None]) -> None:
    """Run ``patch(module)`` on module ``name``: now if it is imported, else as soon as its code
    has run (before the importer gets it back). A rank whose script never imports torch so never
    pays the seconds of importing it for patches it does not need.
    """
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, patch))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: lends the other finders' spec for one module a loader that patches
    the module once its code has run, then leaves ``sys.meta_path``. (Only then: a caller may
    look a module up, ``importlib.util.find_spec``, long before anyone imports it.)"""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self.name, self.patch, self.done, self.searching = name, patch, False, False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or self.searching:
            return None
        spec: importlib.machinery.ModuleSpec | None = None
        self.searching = True  # another patch of the same module asks every finder too
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None) if finder is not self else None
                spec = find(fullname, path, target) if find is not None else None
                if spec is not None:
                    break
        finally:
            self.searching = False
        if spec is None:
            return None
        loader: Any = spec.loader
        run = getattr(loader, "exec_module", None)
        if run is None:  # an old-style loader: patch nothing rather than break the import
            return spec

        def exec_module(module: ModuleType) -> None:
            run(module)
            self._ran(module)

        loader.exec_module = exec_module  # the loader of this spec alone
        return spec

    def _ran(self, module: ModuleType) -> None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        if not self.done:
            self.done = True
            self.patch(module)


_kept_groups: list[Any] = []


def _defer_group_destruction() -> None:
    """Keep destroyed process groups alive until exit, and let gloo's threads go idle first.

    torch < 2.8 destroys a ``ProcessGroupGloo`` with the GIL held while joining its worker
    threads; a worker still releasing a finished collective needs the GIL to free a tensor, and
    the process hangs for ever (fixed by pytorch PR #154976). It bites code that unidist does not
    control, for example a DDP model freed after ``idist.finalize()``: the model's reducer holds
    the last reference to the group. In the ranks unidist launches, ``destroy_process_group``
    therefore keeps a reference to the groups it tears down, and at exit a short sleep (the GIL
    released) lets every worker finish before the interpreter frees them.
    """
    when_imported("torch.distributed", _keep_destroyed_groups)


def _keep_destroyed_groups(dist: Any) -> None:
    from unidist._base.workarounds import GLOO_TEARDOWN_DEADLOCK
    from unidist.session.communicator import drain_gloo_at_exit

    if not GLOO_TEARDOWN_DEADLOCK.present():
        return
    original = dist.destroy_process_group

    def destroy_process_group(group: Any = None) -> None:
        if group is not None:
            _kept_groups.append(group)
        elif dist.is_initialized():
            # Every group goes with the world: the subgroups too (a framework's temporary gloo
            # group, unidist's control group), or the hang page's stack thread, which reads
            # every group's sequence number, could drop the last reference to one of them.
            _kept_groups.append(dist.group.WORLD)
            _kept_groups.extend(dist.distributed_c10d._world.pg_map)
        original(group)

    dist.destroy_process_group = destroy_process_group
    # The same exit drain that GLOO_EXIT_ABORT needs (registered once per process: a script that
    # also calls unidist.initialize() does not add a second); registered here, at the import of
    # torch.distributed, it runs after the exit handlers the script registers later.
    drain_gloo_at_exit()


#: How long the process groups a script left open may take to end at exit before the rank's
#: stacks are dumped to its log and it exits with status 1 (a hang at exit is named, not waited on).
EXIT_DESTROY_TIMEOUT = 60.0


def _end_open_groups() -> None:
    """Destroy, at exit, the process groups the script left open (torch >= 2.8, gloo).

    Most scripts never call ``destroy_process_group()``. On the torch releases of
    :data:`~unidist._base.workarounds.GLOO_EXIT_ABORT`, a gloo worker thread may then free its last
    collective's tensors while the interpreter finalizes, and the rank dies of SIGABRT after its
    work is done: the job is reported failed. Here an :mod:`atexit` handler, registered when the
    script imports ``torch.distributed``, destroys what is still open while the interpreter is
    whole. Order: Python has joined the script's threads and run every exit handler registered
    after it (the script's own, which may still use the group, and unidist's async checkpoint
    saves) before this one runs; the groups go before the interpreter finalizes. A destroy that
    does not return within :data:`EXIT_DESTROY_TIMEOUT` dumps every thread's stack and exits 1.
    Before torch 2.8 a destroy at exit could deadlock (GLOO_TEARDOWN_DEADLOCK): there the exit
    drain registered by :func:`_keep_destroyed_groups` lets the workers finish instead.
    """
    when_imported("torch.distributed", _destroy_at_exit)


def _destroy_at_exit(dist: Any) -> None:
    import atexit

    from unidist._base.workarounds import GLOO_EXIT_ABORT, GLOO_TEARDOWN_DEADLOCK

    if GLOO_EXIT_ABORT.present() and not GLOO_TEARDOWN_DEADLOCK.present():
        atexit.register(_destroy_open_groups, dist)


def _destroy_open_groups(dist: Any) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        return
    faulthandler.dump_traceback_later(EXIT_DESTROY_TIMEOUT, exit=True)
    try:
        dist.destroy_process_group()
    except Exception as exc:
        with contextlib.suppress(Exception):
            print(f"unidist: destroying the open process groups at exit: {exc}", file=sys.stderr)
    finally:
        faulthandler.cancel_dump_traceback_later()


def _prefix_store_by_attempt() -> None:
    """Give each restart of a static job its own keys in the agent's store.

    The static rendezvous lends the ranks the agent's store, the same one for every restart,
    and torch's ``env://`` handler adds no per-attempt prefix (its comment assumes a new store
    per retry), so after a restart gloo may read the previous attempt's addresses and fail with
    "connectFullMesh failed" (torch 2.7 to 2.14; torchrun too). Every rank of an attempt runs
    this, so they all agree on the prefix. (Dynamic rendezvous: the launcher opts out of the
    shared store instead, see ``runner._exports``.)
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or attempt == "0":
        return
    when_imported("torch.distributed.rendezvous", lambda _: _prefix_stores(attempt))


def _prefix_stores(attempt: str) -> None:
    import torch.distributed as dist

    from unidist._base.workarounds import STATIC_STORE_REUSED, replace_c10d_store

    if not STATIC_STORE_REUSED.present():
        return

    def with_prefix(create: Callable[..., Any]) -> Callable[..., Any]:
        def create_with_prefix(*args: Any, **kwargs: Any) -> Any:
            return dist.PrefixStore(f"/unidist/attempt_{attempt}", create(*args, **kwargs))

        return create_with_prefix

    replace_c10d_store(with_prefix)


def _bind_group_store_to_master_addr() -> None:
    """On one node, rank 0's store for the process group listens on ``MASTER_ADDR`` only.

    The launcher gives every rendezvous round a fresh store hosted by rank 0 (see
    ``runner._exports``), and torch binds that ``TCPStore`` server on every interface (``::``),
    open to other hosts. When every rank runs on this node, every client resolves ``MASTER_ADDR``
    here, so rank 0 can listen on exactly that address instead: it hands torch a socket bound
    there (``master_listen_fd``; on torch < 2.8 with torch's older server, which is the only one
    that accepts it, see :data:`unidist._base.workarounds.LIBUV_STORE_LISTEN_FD`). Across nodes
    torch's own behaviour stays: a host name can resolve to a loopback alias on its own host
    (``127.0.1.1``) and to a routable address elsewhere, so only the wildcard is safe there.
    """
    from unidist.environments import variables as _env

    reading = _env.read()
    if reading.rank != 0 or reading.agent_store or reading.local_world_size != reading.world_size:
        return
    when_imported("torch.distributed.rendezvous", lambda _: _bind_stores())


def _bind_stores() -> None:
    import torch.distributed as dist

    from unidist._base.workarounds import (
        LIBUV_STORE_LISTEN_FD,
        STORE_LISTENS_EVERYWHERE,
        replace_c10d_store,
    )
    from unidist.errors import ConfigurationError
    from unidist.session import listen

    if not STORE_LISTENS_EVERYWHERE.present():
        return

    def bound(create: Callable[..., Any]) -> Callable[..., Any]:
        def create_bound(
            hostname: str,
            port: int,
            rank: int,
            world_size: int,
            timeout: Any,
            use_libuv: bool = True,
        ) -> Any:
            if rank != 0:  # a client: torch's way
                return create(hostname, port, rank, world_size, timeout, use_libuv)
            try:
                listener, _ = listen.bind((hostname,), port)
            except ConfigurationError:  # an address that is not this host's: torch's way
                return create(hostname, port, rank, world_size, timeout, use_libuv)
            return dist.TCPStore(
                hostname,
                port,
                world_size,
                True,
                timeout=timeout,
                multi_tenant=True,
                master_listen_fd=listener.detach(),  # TCPStore owns and closes it
                use_libuv=use_libuv and not LIBUV_STORE_LISTEN_FD.present(),
            )

        return create_bound

    replace_c10d_store(bound)


def failure_kind(exc: BaseException) -> str:
    """``"raised"`` (this rank's own failure), ``"collateral"`` or ``"timeout"`` (another's)."""
    from unidist.errors import DistributedTimeoutError, RemoteError, translated

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        mapped = translated(current, "") or current
        if isinstance(mapped, RemoteError):
            return "collateral"
        if isinstance(mapped, DistributedTimeoutError | TimeoutError):
            return "timeout"
        current = current.__cause__ or current.__context__
    return "raised"


def record_error(exc: BaseException) -> None:
    """Write this rank's error file (``TORCHELASTIC_ERROR_FILE``, torch's format) for the
    launcher's report and torch's agent: the exception, and whether it was this rank's fault.

    A script's ``@record`` (torch's) may have written the file a moment before, with the same
    exception; this replaces it with the same content plus unidist's classification.
    """
    from unidist.hangs import stacks

    stacks.failed(exc)
    records.write_error(
        _identity(), exc, failure_kind(exc), "".join(traceback.format_exception(exc))[-6000:]
    )


def record_done() -> None:
    """Record that this rank finished normally."""
    from unidist.hangs import stacks

    stacks.finish()
    _write("done", {})
    records.release()
    records.await_leave()
