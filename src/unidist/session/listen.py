"""Where unidist's control store listens: loopback on one host, the rendezvous address otherwise.

``torch.distributed.TCPStore`` binds its server to every interface (``::`` or ``0.0.0.0``) unless
it is handed a socket that is already listening (``master_listen_fd``). unidist binds that socket
itself, on one address: ``127.0.0.1`` when every rank runs on one host, else the address that
``MASTER_ADDR`` names (the one the rendezvous already uses), so the store is reachable only where
it must be. torch < 2.8's libuv server refuses a listening socket (pytorch PR #150215), so there the
store runs on torch's older server (see :data:`unidist._base.workarounds.LIBUV_STORE_LISTEN_FD`).
"""

from __future__ import annotations

import socket
from datetime import timedelta

from unidist._base.workarounds import LIBUV_STORE_LISTEN_FD
from unidist.errors import ConfigurationError
from unidist.session.link import Link, connect_within, find_connection, sockets

__all__ = ["LOOPBACK", "bind", "connect", "serve"]

LOOPBACK = ("127.0.0.1", "::1")
#: Pending connections the listening socket queues (every rank connects at start-up).
_BACKLOG = 4096


def serve(hosts: tuple[str, ...], timeout: timedelta) -> tuple[Link, str]:
    """Start a store server listening on the first of ``hosts`` that is an address of this host.

    Returns:
        A link to the store (a client of its own server too) and the address it listens on.

    Raises:
        ConfigurationError: none of ``hosts`` is an address of this host.
    """
    import torch.distributed as dist

    listener, address = bind(hosts)
    port = listener.getsockname()[1]
    before = sockets()
    # TCPStore takes the socket over (it closes the descriptor when it stops).
    store = dist.TCPStore(
        address,
        port,
        None,
        True,
        timeout=timeout,
        wait_for_workers=False,
        master_listen_fd=listener.detach(),
        use_libuv=not LIBUV_STORE_LISTEN_FD.present(),
    )
    host = f"rank 0 at {address}:{port}"
    return Link(store, host, find_connection(before, port)), address


def connect(address: str, port: int, timeout: timedelta) -> Link:
    """A link to the store that rank 0 serves at ``address``:``port``, within ``timeout``."""
    return connect_within(address, port, timeout, f"rank 0 at {address}:{port}")


def bind(hosts: tuple[str, ...], port: int = 0) -> tuple[socket.socket, str]:
    """A socket listening on ``port`` (0: a free one) of the first bindable address of ``hosts``.

    Raises:
        ConfigurationError: no address of ``hosts`` could be bound, with what was tried.
    """
    tried: list[str] = []
    for host in hosts:
        try:
            infos = socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
            )
        except OSError as exc:
            tried.append(f"{host} ({exc})")
            continue
        for family, kind, proto, _, sockaddr in infos:
            listener = socket.socket(family, kind, proto)
            try:
                listener.bind(sockaddr)
                listener.listen(_BACKLOG)
            except OSError as exc:
                listener.close()
                tried.append(f"{host} -> {sockaddr[0]} ({exc.strerror or exc})")
                continue
            return listener, str(sockaddr[0])
    raise ConfigurationError(
        f"rank 0 cannot listen for unidist's control store on {', '.join(hosts)}: tried "
        f"{'; '.join(tried)}. HINT: MASTER_ADDR must name an address of the host that runs "
        "rank 0 (the address the other hosts reach it at)."
    )
