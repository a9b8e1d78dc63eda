"""The torch bugs unidist works around, and the torch versions each one applies to.

Every workaround in unidist asks :meth:`TorchBug.present` before it acts, so it is active only on
the torch releases that have the bug, and it can be deleted once the supported floor passes
``fixed_in``. Each bug has two tests (``tests/test_workarounds.py``): on an affected torch the
workaround works; on a fixed torch the bug is absent without it.

========================  ====================  ===========================================
bug                       affected torch        worked around in
========================  ====================  ===========================================
gloo teardown deadlock    < 2.8                 ``_comm.communicator`` (finalize releases the
(pytorch PR #154976)                            GIL before the destroy), ``launch.rank.runtime``
                                                (destroyed groups kept until a GIL-released
                                                exit)
gloo aborts at exit       every release so far  ``launch.rank.runtime`` (from 2.8, where it
(pytorch#190489)          (often on 2.14, rare  cannot deadlock, the groups a script left open
                          on 2.7)               are destroyed at exit, before the interpreter
                                                finalizes; before 2.8 the first bug's exit
                                                drain), ``_comm.communicator`` (any
                                                torch-backed session: at exit the GIL is
                                                released so that the workers drop their last
                                                tensors first)
gloo AVG sums             < 2.9                 ``parallel._gloo`` (an FSDP2 all-reduce hook
(pytorch#162338)                                divides the reduce-scatter result)
gloo has no AVG           < 2.8                 ``parallel._apply`` (FSDP2 HSDP over gloo is
all-reduce (PR #149781)                         refused up front instead of failing in
                                                backward)
libuv store refuses a     < 2.8                 ``_comm.listen`` (the control store runs on
listening socket                                torch's older server, which takes the socket
(PR #150215)                                    bound to loopback or MASTER_ADDR)
static store reused       every release so far  ``launch.rank.runtime`` (each restart's keys
across restarts           (2.7 to 2.14)         get their own prefix, through
                                                :func:`replace_c10d_store`)
group store listens on    every release so far  ``launch.rank.runtime`` (on one node rank 0's
every interface           (2.7 to 2.14)         store listens on MASTER_ADDR only, through
                                                :func:`replace_c10d_store`)
========================  ====================  ===========================================

:func:`replace_c10d_store` is the only patch of a torch private in unidist; the two bugs above
that use it are gated like the others, with ``fixed_in=None`` until a release fixes them.

The releases were measured on this project's machines (``tests/test_workarounds.py`` in the
pinned and latest environments, and by hand on 2.4.1, 2.5.1, 2.8.0, 2.9.0, 2.9.1, 2.10.0 and
2.11.0): the deadlock hung 5 of 5 runs of 10 rounds on 2.7.0 and 0 of 5 on 2.8.0 and every later
release tried; reduce_scatter AVG summed on 2.4.1 to 2.8.0 and averaged from 2.9.0 on;
all_reduce AVG was refused up to 2.7.0 and worked from 2.8.0 on; the libuv store refused a
listening socket on 2.7.0 and took it on 2.14.1. The abort at exit killed 5 of 8 two-rank
torchrun jobs on 2.14.1; on 2.7.0 it is rarer (a unidist script ending right after 200
all-reduces under plain torchrun, two busy processes beside it: 2 of 100, and once in a test
matrix run) but present, so the exit drain is registered on every release; destroying the open
groups at exit is done from 2.8 on only, where it cannot deadlock (the first bug).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GLOO_AVG_SUMS",
    "GLOO_EXIT_ABORT",
    "GLOO_NO_AVG_ALL_REDUCE",
    "GLOO_TEARDOWN_DEADLOCK",
    "LIBUV_STORE_LISTEN_FD",
    "STATIC_STORE_REUSED",
    "STORE_LISTENS_EVERYWHERE",
    "TORCH_BUGS",
    "TorchBug",
    "replace_c10d_store",
    "torch_version",
]


def torch_version(text: str | None = None) -> tuple[int, int]:
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
        return self.fixed_in is None or torch_version(version) < self.fixed_in

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


def replace_c10d_store(wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Put ``wrap(original)`` in place of torch's private ``rendezvous._create_c10d_store``.

    The store the ``env://`` and ``tcp://`` rendezvous create for the process group; the only
    torch private unidist patches (for :data:`STATIC_STORE_REUSED` and
    :data:`STORE_LISTENS_EVERYWHERE`). Returns False, patching nothing, on a torch without it.
    """
    # importlib: ``import torch.distributed.rendezvous as m`` binds the *function* that
    # torch.distributed re-exports under the module's name, not the module.
    rendezvous: Any = importlib.import_module("torch.distributed.rendezvous")
    create = getattr(rendezvous, "_create_c10d_store", None)
    if create is None:
        return False
    rendezvous._create_c10d_store = wrap(create)
    return True
