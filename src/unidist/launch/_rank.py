"""What runs inside every rank that ``unidist launch`` or :func:`unidist.spawn` starts.

Each rank leaves small JSON records in the run's event folder (``UNIDIST_EVENTS``): when it
started (pid, rank, host), how it ended (finished, or the exception it raised and whether that
exception was its own fault or the consequence of another rank's failure). The launcher reads
them to name the culprit. Each rank also:

* dumps every thread's Python stack to its stderr log when the launcher stops it (SIGTERM or
  SIGINT) or asks for it (SIGUSR1), so the report shows what a stopped rank was doing;
* dies at once on SIGINT from the launcher instead of waiting in a collective for a
  KeyboardInterrupt that cannot be delivered (a script's own signal handler still wins);
* asks Linux to kill it if the launcher itself dies (no orphans);
* exports ``NODE_RANK`` (torch's agent only sets ``GROUP_RANK``) for Composer's ``dist``;
* works around the gloo destructor deadlock of torch < 2.8 (see :func:`_defer_group_destruction`).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

__all__ = ["classify", "die_with_parent", "prepare_rank", "record_done", "record_error"]

EVENTS = "UNIDIST_EVENTS"


def _identity() -> dict[str, Any]:
    env = os.environ
    return {
        "rank": int(env.get("RANK", "0")),
        "local_rank": int(env.get("LOCAL_RANK", "0")),
        "node_rank": int(env.get("GROUP_RANK", env.get("NODE_RANK", "0"))),
        "attempt": int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }


def _write(kind: str, payload: dict[str, Any]) -> None:
    folder = os.environ.get(EVENTS)
    if not folder:
        return
    me = _identity()
    path = Path(folder, f"{kind}-a{me['attempt']}-r{me['rank']}.json")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**me, **payload, "time_ns": time.time_ns()}))
    tmp.replace(path)


def prepare_rank() -> None:
    """Set up this rank: variables, signal handling, death with the parent; record the start."""
    if "GROUP_RANK" in os.environ:
        os.environ.setdefault("NODE_RANK", os.environ["GROUP_RANK"])
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    for sig in (signal.SIGTERM, signal.SIGINT):
        faulthandler.register(sig, all_threads=True, chain=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    _defer_group_destruction()
    _write("start", {})


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no orphans); elsewhere, nothing.

    Used by the launcher's ranks and by :func:`unidist.testing.run_distributed`'s.
    """
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


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
    import atexit

    import torch.distributed as dist

    from unidist._workarounds import GLOO_TEARDOWN_DEADLOCK

    if not GLOO_TEARDOWN_DEADLOCK.present():
        return
    original = dist.destroy_process_group

    def destroy_process_group(group: Any = None) -> None:
        if group is not None:
            _kept_groups.append(group)
        elif dist.is_initialized():
            _kept_groups.append(dist.group.WORLD)
        original(group)

    dist.destroy_process_group = destroy_process_group
    atexit.register(time.sleep, 0.1)


def classify(exc: BaseException) -> str:
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
    """Record why this rank is failing (and hand it to torch's error file as well)."""
    lines = traceback.format_exception(exc)
    _write(
        "error",
        {
            "kind": classify(exc),
            "type": type(exc).__name__,
            "message": str(exc)[:2000],
            "traceback": "".join(lines)[-6000:],
        },
    )
    with contextlib.suppress(Exception):
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        get_error_handler().record_exception(exc)


def record_done() -> None:
    """Record that this rank finished normally."""
    _write("done", {})
