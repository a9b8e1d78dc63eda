"""A client of the control store whose every round trip has a deadline.

``torch.distributed.TCPStore`` bounds its *waits* (``wait``, and the wait inside ``get``) with its
timeout, but nothing else: when the process that hosts the store is stopped (``SIGSTOP``, a
debugger, a frozen host), an ``add``, ``compare_set``, ``check`` or ``delete_key`` waits for an
answer for ever, and so does the client's constructor (it pings the server), on every torch
from 2.7 to 2.14 at least. ``set_timeout`` does not change that.

A :class:`Link` puts the deadline on the socket itself: before each step the control plane
calls :meth:`Link.limit`, which sets ``SO_RCVTIMEO`` and ``SO_SNDTIMEO`` on the client's
connection, so a read that gets no answer fails with torch's ``DistNetworkError`` ("Socket
Timeout") instead of blocking; torch turns the ``EAGAIN`` into that exception on every torch
tested (2.7 and 2.14). The constructor runs in a helper thread with its own deadline (torch
releases the GIL while it connects). The connection is found by its peer port among the
sockets that appeared while the client was created.

A connection on which a read timed out is out of step (the answer may still come), so the link
is then *broken*: every later call fails at once with the same error, naming the store's host.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
import threading
import warnings
import weakref
from datetime import timedelta
from typing import Any

from unidist.errors import DistributedTimeoutError, RemoteError, TorchFailure, torch_failure

__all__ = ["UNANSWERED_BOUND", "Link", "connect_within", "find_connection", "sockets"]

#: Seconds a live store host takes at most to answer once the deadline of a wait has passed
#: (torch then asks the server to stop waiting and reads its answer). A frozen host is named
#: within the caller's timeout plus this bound.
UNANSWERED_BOUND = 2.0
#: Sockets are listed and created one client at a time, so that new sockets are ours.
_CREATING = threading.Lock()


class Link:
    """A store client (``store``) and the deadline of its round trips.

    Args:
        store: a ``TCPStore`` client (or anything with its methods: tests wrap one to count).
        host: who serves the store, for messages ("rank 0 at 127.0.0.1:4242").
        connection: the client's socket (a duplicate of its descriptor); None when it could not
            be found, and then round trips have no deadline of their own (a warning says so).
    """

    def __init__(self, store: Any, host: str, connection: socket.socket | None = None) -> None:
        self.store = store
        self.host = host
        self._connection = connection
        if connection is not None:  # closed with the link, before the socket's own finalizer
            weakref.finalize(self, connection.close)
        self._limit: float | None = None
        #: Why the link no longer works (set once a round trip ran out of time).
        self.broken: str | None = None

    def limit(self, seconds: float) -> None:
        """Let every round trip from now on take at most ``seconds`` (at least 1 ms)."""
        if self.broken is not None:
            raise DistributedTimeoutError(self.broken)
        seconds = max(seconds, 0.001)
        if self._connection is None or seconds == self._limit:
            return
        whole = int(seconds)
        value = struct.pack("ll", whole, int((seconds - whole) * 1e6))
        self._connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        self._connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
        self._limit = seconds

    def unanswered(self, exc: BaseException, what: str) -> DistributedTimeoutError | None:
        """The error for ``exc`` if it says the host did not answer in time (and break the link).

        Returns None for any other failure (a wait that ran out, a closed connection).
        """
        if torch_failure(exc) is not TorchFailure.NETWORK_TIMEOUT:
            return None
        self.broken = (
            f"{what}: {self.host}, which hosts unidist's control store, did not answer within "
            f"{self._limit or 0:g} s. HINT: that process is stopped (SIGSTOP, a debugger), "
            "frozen or cut off from this rank; look at its state (`ps -o stat,pid,cmd`) and "
            "its log."
        )
        return DistributedTimeoutError(self.broken)

    def closed_by_peer(self) -> bool:
        """Whether the store's host has closed this connection (its process left).

        One ``recv(MSG_PEEK)`` that does not wait: a store only answers requests, so anything
        readable between two round trips is the end of the stream (or an error on it). Asking
        first spares the caller torch's client finding out itself, which logs a C++ warning with
        its stack ("recvValue failed ... got 0 bytes") before it raises. False when the
        connection is unknown (nothing to ask) or something else is waiting to be read.
        """
        if self._connection is None:
            return False
        try:
            data = self._connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False  # nothing to read: the connection is open
        except OSError:
            return True  # reset by the peer, or otherwise unusable
        return data == b""

    def close(self) -> None:
        """Close the duplicate descriptor (the store keeps its own)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def connect_within(address: str, port: int, timeout: timedelta, host: str) -> Link:
    """A :class:`Link` to the store at ``address``:``port``, connected within ``timeout``.

    Raises:
        DistributedTimeoutError: the server accepted the connection but did not answer (its
            host is stopped), or nothing could connect in time.
        RemoteError: the connection failed.
    """
    import torch.distributed as dist

    from unidist._base.workarounds import LIBUV_STORE_LISTEN_FD

    made: list[Any] = []
    failed: list[BaseException] = []

    def create() -> None:
        try:
            use_libuv = not LIBUV_STORE_LISTEN_FD.present()
            made.append(dist.TCPStore(address, port, None, False, timeout, use_libuv=use_libuv))
        except BaseException as exc:  # reported by the caller's thread
            failed.append(exc)

    with _CREATING:
        before = sockets()
        # torch connects and pings with the GIL released; a stopped host never answers the ping.
        thread = threading.Thread(target=create, name="unidist-store-connect", daemon=True)
        thread.start()
        thread.join(timeout.total_seconds() + UNANSWERED_BOUND)
        if thread.is_alive():
            raise DistributedTimeoutError(
                f"connecting to unidist's control store: {host} did not answer within "
                f"{timeout.total_seconds():g} s. HINT: that process is stopped, frozen or "
                "overloaded; look at its state and its log."
            )
        if failed:
            raise RemoteError(
                f"connecting to unidist's control store ({host}) failed: {failed[0]}"
            ) from failed[0]
        return Link(made[0], host, find_connection(before, port))


def find_connection(before: set[tuple[int, int]], port: int) -> socket.socket | None:
    """A duplicate of the one client socket to ``port`` that is not among ``before``."""
    found: dict[tuple[Any, Any], socket.socket] = {}
    for fd, _ in sorted(sockets() - before):
        sock = _client_to(fd, port)
        if sock is None:
            continue
        ends = (sock.getsockname()[:2], sock.getpeername()[:2])
        if ends in found:  # one connection under two descriptors (torch may hold a copy)
            sock.close()
        else:
            found[ends] = sock
    if len(found) == 1:
        return next(iter(found.values()))
    seen = list(found)
    for sock in found.values():
        sock.close()
    warnings.warn(
        f"unidist could not find its connection to the control store (port {port}; "
        f"candidates: {seen}): its round trips are bounded by torch's own timeouts only, so a "
        "stopped store host may not be named in time.",
        RuntimeWarning,
        stacklevel=3,
    )
    return None


def sockets() -> set[tuple[int, int]]:
    """This process's sockets, as (descriptor, inode) pairs.

    The inode tells a new socket from an old descriptor number reused (the folder listing
    itself takes a descriptor, which the next socket may get).
    """
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        found = set()
        for name in names:
            try:
                status = os.fstat(int(name))
            except OSError:  # the listing's own descriptor, closed since
                continue
            if stat.S_ISSOCK(status.st_mode):
                found.add((int(name), status.st_ino))
        return found
    return set()


def _client_to(fd: int, port: int) -> socket.socket | None:
    """A duplicate of ``fd`` if it is a TCP connection from an ephemeral port to ``port``."""
    try:
        copy = os.dup(fd)
    except OSError:
        return None
    try:
        sock = socket.socket(fileno=copy)
    except OSError:  # not a socket
        os.close(copy)
        return None
    try:
        if (
            sock.type == socket.SOCK_STREAM
            and sock.getpeername()[1] == port
            and sock.getsockname()[1] != port  # not a connection the server accepted
        ):
            return sock
    except OSError:
        pass
    sock.close()
    return None
