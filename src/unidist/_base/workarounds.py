"""The torch and CPython bugs unidist works around, and the releases each one applies to.

Every workaround in unidist asks its bug's ``present()`` (:meth:`TorchBug.present`,
:meth:`PythonBug.present`) before it acts, so it is active only on the releases that have the
bug, and it can be deleted once the supported floor passes ``fixed_in``. Each bug has two
tests (``tests/_base/test_workarounds.py``, and the tests of the module that works around it): on
an affected release the workaround works; on a fixed one it is not applied.

========================  ====================  ===========================================
bug                       affected torch        worked around in
========================  ====================  ===========================================
gloo teardown deadlock    < 2.8                 ``session.communicator`` (finalize releases the
(pytorch PR #154976)                            GIL before the destroy), ``launch.rank.runtime``
                                                (destroyed groups kept until a GIL-released
                                                exit)
gloo aborts at exit       every release so far  ``launch.rank.runtime`` (from 2.8, where it
(pytorch#190489)          (often on 2.14, rare  cannot deadlock, the groups a script left open
                          on 2.7)               are destroyed at exit, before the interpreter
                                                finalizes; before 2.8 the first bug's exit
                                                drain), ``session.communicator`` (any
                                                torch-backed session: at exit the GIL is
                                                released so that the workers drop their last
                                                tensors first)
gloo AVG sums             < 2.9                 ``parallel._gloo`` (an FSDP2 all-reduce hook
(pytorch#162338)                                divides the reduce-scatter result)
gloo has no AVG           < 2.8                 ``parallel._apply`` (FSDP2 HSDP over gloo is
all-reduce (PR #149781)                         refused up front instead of failing in
                                                backward)
libuv store refuses a     < 2.8                 ``session.listen`` (the control store runs on
listening socket                                torch's older server, which takes the socket
(PR #150215)                                    bound to loopback or MASTER_ADDR)
static store reused       every release so far  ``launch.rank.runtime`` (each restart's keys
across restarts           (2.7 to 2.14)         get their own prefix, through
                                                :func:`replace_c10d_store`)
group store listens on    every release so far  ``launch.rank.runtime`` (on one node rank 0's
every interface           (2.7 to 2.14)         store listens on MASTER_ADDR only, through
                                                :func:`replace_c10d_store`)
========================  ====================  ===========================================

The releases were measured with ``tests/_base/test_workarounds.py`` in the pinned and latest
environments, and by hand on 2.4.1, 2.5.1, 2.8.0, 2.9.0, 2.9.1, 2.10.0 and 2.11.0: the deadlock
is in 2.7.0 and in no release from 2.8.0 on; reduce_scatter AVG sums on 2.4.1 to 2.8.0; all_reduce
AVG is refused up to 2.7.0; the libuv store refuses a listening socket on 2.7.0 and takes it on
2.14.1; the abort at exit is in every release tried, 2.7.0 included. So the exit drain is
registered on every release, and the open groups are destroyed at exit from 2.8 on only, where
that cannot deadlock (the first bug).

========================  ====================  ===========================================
CPython bug               affected Python       worked around in
========================  ====================  ===========================================
fork copies HEAD_LOCK     3.10 < 3.10.15,       ``data._forks`` (a forked DataLoader worker
held (gh-112275)          3.11 < 3.11.10        that has not run its first line by a
                          (none from 3.12 on)   deadline is forked again in its place)
========================  ====================  ===========================================

CPython gh-112275 is fixed in 3.11.10 and 3.10.15 (released 2024-09-07; the gh-112275 entries
of their ``Misc/NEWS.d``, for python/cpython PR #112336 and its 3.10 backport); 3.12.0 and later
never had it (the issue, and that entry: "based on previous Python 3.12 fix").

This module is the only place unidist writes torch privates: :func:`replace_c10d_store` (for the
two store bugs above, gated like the others, with ``fixed_in=None`` until a release fixes them),
:func:`replace_dataloader_worker` (for :data:`FORK_HEAD_LOCK`) and, for no bug but a hook torch
does not offer, :func:`count_checkpoint_writes` (a checkpoint's writes counted as progress).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import operator
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FORK_HEAD_LOCK",
    "GLOO_AVG_SUMS",
    "GLOO_EXIT_ABORT",
    "GLOO_NO_AVG_ALL_REDUCE",
    "GLOO_TEARDOWN_DEADLOCK",
    "LIBUV_STORE_LISTEN_FD",
    "PYTHON_BUGS",
    "STATIC_STORE_REUSED",
    "STORE_LISTENS_EVERYWHERE",
    "TORCH_BUGS",
    "PythonBug",
    "TorchBug",
    "python_version",
    "count_checkpoint_writes",
    "replace_c10d_store",
    "replace_dataloader_worker",
    "torch_release",
]


def torch_release(text: str | None = None) -> tuple[int, int]:
    """(major, minor) of ``text`` or of the installed torch (``"2.7.0+cu126"`` -> ``(2, 7)``)."""
    if text is None:
        import torch

        text = str(torch.__version__)
    found = re.match(r"(\d+)\.(\d+)", text)
    if found is None:
        raise ValueError(f"cannot read a torch version from {text!r}")
    return int(found[1]), int(found[2])


@dataclass(frozen=True)
class TorchBug:
    """One upstream torch bug that unidist works around.

    Attributes:
        name: short name, used in docs and ``unidist probe``.
        upstream: the upstream issue or pull request.
        summary: what goes wrong, in one sentence.
        fixed_in: the first torch release (major, minor) without the bug; None while no
            release has fixed it.
    """

    name: str
    upstream: str
    summary: str
    fixed_in: tuple[int, int] | None

    def present(self, version: str | None = None) -> bool:
        """Whether torch ``version`` (default: the installed one) has the bug."""
        return self.fixed_in is None or torch_release(version) < self.fixed_in

    @property
    def affected(self) -> str:
        """The affected releases, in words (``"torch < 2.8"``, ``"every torch release so far"``)."""
        if self.fixed_in is None:
            return "every torch release so far"
        return f"torch < {self.fixed_in[0]}.{self.fixed_in[1]}"


GLOO_TEARDOWN_DEADLOCK = TorchBug(
    "gloo teardown deadlock",
    "pytorch PR #154976",
    "ProcessGroupGloo's destructor joins its worker threads with the GIL held; a worker that "
    "needs the GIL to free a tensor deadlocks destroy_process_group()",
    (2, 8),
)
GLOO_AVG_SUMS = TorchBug(
    "gloo AVG sums",
    "pytorch#162338",
    "gloo's reduce_scatter_tensor(op=AVG) returns the sum, so FSDP2 on CPU gets gradients "
    "world-size times too large, silently",
    (2, 9),
)
GLOO_NO_AVG_ALL_REDUCE = TorchBug(
    "gloo has no AVG all-reduce",
    "pytorch PR #149781 (ProcessGroupGloo: support ReduceOp::AVG)",
    "gloo's all_reduce refuses ReduceOp.AVG, which FSDP2 uses across the replicas of HSDP",
    (2, 8),
)
LIBUV_STORE_LISTEN_FD = TorchBug(
    "libuv store refuses a listening socket",
    "pytorch PR #150215 (TCPStoreLibUvBackend: support masterListenFd)",
    "TCPStore's libuv server rejects master_listen_fd, so it can only listen on every interface",
    (2, 8),
)
STATIC_STORE_REUSED = TorchBug(
    "static store reused across restarts",
    "pytorch torch/distributed/rendezvous.py (the env:// handler adds no per-attempt prefix)",
    "after a restart the ranks get the agent's store again with the previous attempt's keys, "
    "and gloo may read the old addresses (connectFullMesh failed)",
    None,
)
STORE_LISTENS_EVERYWHERE = TorchBug(
    "group store listens on every interface",
    "pytorch torch/distributed/rendezvous.py (_create_c10d_store binds TCPStore to ::)",
    "rank 0's store for the process group listens on every interface, open to other hosts, "
    "even when every rank runs on one node",
    None,
)
GLOO_EXIT_ABORT = TorchBug(
    "gloo aborts at exit",
    "pytorch#190489 (an atexit destroy, PR #179291, was abandoned)",
    "a gloo worker thread that frees its last collective's tensors after the interpreter "
    "began finalizing asks for the GIL; Python ends the thread with pthread_exit, whose "
    "unwinding through the work's noexcept destructor calls std::terminate: the rank dies of "
    "SIGABRT ('terminate called without an active exception') after its work is done",
    None,
)
TORCH_BUGS = (
    GLOO_TEARDOWN_DEADLOCK,
    GLOO_EXIT_ABORT,
    GLOO_AVG_SUMS,
    GLOO_NO_AVG_ALL_REDUCE,
    LIBUV_STORE_LISTEN_FD,
    STATIC_STORE_REUSED,
    STORE_LISTENS_EVERYWHERE,
)


def python_version() -> tuple[int, int, int]:
    """(major, minor, micro) of the running Python, which :meth:`PythonBug.present` reads."""
    return sys.version_info.major, sys.version_info.minor, sys.version_info.micro


@dataclass(frozen=True)
class PythonBug:
    """One upstream CPython bug that unidist works around.

    Attributes:
        name: short name, used in docs and logs.
        upstream: the upstream issue or pull request.
        summary: what goes wrong, in one sentence.
        fixed_in: for each release line that has had the bug or was the first without it, its
            first release without it, oldest line first (``(3, 12, 0)``: the line never had
            it). A line older than the first listed has the bug; one newer than the last does
            not.
    """

    name: str
    upstream: str
    summary: str
    fixed_in: tuple[tuple[int, int, int], ...]

    def present(self, version: tuple[int, int, int] | None = None) -> bool:
        """Whether Python ``version`` (default: the running one) has the bug."""
        version = python_version() if version is None else version
        for fixed in self.fixed_in:
            if version[:2] == fixed[:2]:
                return version < fixed
        return version[:2] < self.fixed_in[0][:2]

    @property
    def affected(self) -> str:
        """The affected releases, in words (``"Python 3.10 < 3.10.15, 3.11 < 3.11.10"``)."""
        lines = [
            f"{major}.{minor} < {major}.{minor}.{micro}"
            for major, minor, micro in self.fixed_in
            if micro
        ]
        return "Python " + ", ".join(lines)


FORK_HEAD_LOCK = PythonBug(
    "fork copies HEAD_LOCK held",
    "CPython gh-112275 (fixed by python/cpython PR #112336 and its backports)",
    "a child forked while another thread held the runtime's HEAD_LOCK (a thread entering Python "
    "from C for the first time takes it without the GIL, as gloo's threads do after each "
    "collective) takes that lock again before resetting it, and never runs a line",
    ((3, 10, 15), (3, 11, 10), (3, 12, 0)),
)
PYTHON_BUGS = (FORK_HEAD_LOCK,)


def replace_c10d_store(wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Put ``wrap(original)`` in place of torch's private ``rendezvous._create_c10d_store``.

    The store the ``env://`` and ``tcp://`` rendezvous create for the process group (for
    :data:`STATIC_STORE_REUSED` and :data:`STORE_LISTENS_EVERYWHERE`). Returns False, patching
    nothing, on a torch without it.
    """
    # importlib: ``import torch.distributed.rendezvous as m`` binds the *function* that
    # torch.distributed re-exports under the module's name, not the module.
    rendezvous: Any = importlib.import_module("torch.distributed.rendezvous")
    create = getattr(rendezvous, "_create_c10d_store", None)
    if create is None:
        return False
    rendezvous._create_c10d_store = wrap(create)
    return True


def replace_dataloader_worker(iterator: Any, stuck: Any, fresh: Any) -> None:
    """Put the process ``fresh`` in ``stuck``'s place among a DataLoader iterator's workers.

    For :data:`FORK_HEAD_LOCK` (``unidist.data._forks``). Writes torch privates: the
    iterator's ``_workers`` list and, once the iterator has registered its workers' pids with
    torch's SIGCHLD check (``_worker_pids_set``), that registration, so that torch joins,
    checks and stops ``fresh`` as it would have ``stuck``.
    """
    workers = iterator._workers
    workers[workers.index(stuck)] = fresh
    if not getattr(iterator, "_worker_pids_set", False):
        return
    from torch.utils.data._utils import signal_handling

    key = id(iterator)
    pids = tuple(worker.pid for worker in workers)
    calls = (
        functools.partial(signal_handling._remove_worker_pids, key),  # type: ignore[attr-defined]
        functools.partial(signal_handling._set_worker_pids, key, pids),  # type: ignore[attr-defined]
    )
    # Both run in C, back to back, with no Python bytecode between them, so no other thread
    # runs in between: torch's own shutdown never finds the iterator unregistered.
    collections.deque(map(operator.methodcaller("__call__"), calls), maxlen=0)


#: Bytes a checkpoint write is cut into: each chunk written is counted as progress.
WRITE_CHUNK = 1 << 20


def count_checkpoint_writes(writer: Any, moved: Callable[[], None]) -> Any:
    """``writer`` (torch's ``FileSystemWriter`` or ``FsspecWriter``), whose every file counts
    its writes: ``moved()`` after each :data:`WRITE_CHUNK` bytes it has written.

    Not a bug's workaround: torch gives no hook on a save's writes, and a save that writes is
    progress for the hang watch (``unidist.hangs``) even while the main thread waits, for
    minutes, in an object store's client. Writes a torch private: the writer's ``fs`` (the
    object whose ``create_stream`` opens each file, in torch 2.7 to 2.14), replaced by one that
    hands out counting streams; a writer without one is returned as it is.
    """
    inner = getattr(writer, "fs", None)
    if inner is None or not callable(getattr(inner, "create_stream", None)):
        return writer
    writer.fs = _CountingFileSystem(inner, moved)
    return writer


class _Counting:
    """A stand-in for torch's object ``inner``, which counts writes through ``moved``; what it
    does not define itself is ``inner``'s."""

    def __init__(self, inner: Any, moved: Callable[[], None]) -> None:
        self._inner = inner
        self._moved = moved

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # never ask for its own fields (copy and pickle do, early)
            raise AttributeError(name)
        return getattr(self._inner, name)


class _CountingFileSystem(_Counting):
    """torch's file system object, with streams opened for writing that count their writes."""

    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        with self._inner.create_stream(path, mode) as stream:
            yield _CountingStream(stream, self._moved) if set(mode) & set("wa+") else stream


class _CountingStream(_Counting):
    """A stream whose ``write`` goes in chunks, each counted once written."""

    def __enter__(self) -> _CountingStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._inner.close()

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        total = 0
        for start in range(0, len(view), WRITE_CHUNK):
            chunk = view[start : start + WRITE_CHUNK]
            written = self._inner.write(chunk)
            total += len(chunk) if written is None else int(written)
            self._moved()
        return total
