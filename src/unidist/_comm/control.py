"""unidist's control plane: a small TCP key-value store for waits that must end on time.

Collectives cannot be cancelled: a ``work.wait(timeout)`` that gives up leaves the operation
queued in gloo, and the next teardown blocks on it. Waits with their own deadline (a barrier
with ``timeout=``, ranks waiting in ``one_rank_first``, OOM agreement) therefore go through a
``torch.distributed.TCPStore`` that unidist owns, hosted by rank 0 on a free port. A timed-out
store wait leaves nothing behind, and the keys that are missing name the ranks that never came.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from unidist.errors import DistributedTimeoutError, RemoteError

__all__ = ["ControlPlane"]

_PREFIX = "unidist/control"


class ControlPlane:
    """Barriers and one-to-many messages over a store, each wait with its own deadline."""

    def __init__(self, store: Any, rank: int) -> None:
        self._store = store
        self._rank = rank
        self._counters: dict[tuple[str, tuple[int, ...]], int] = {}
        #: Keys this rank published in exchanges that others may still read, per group.
        self._published: dict[tuple[int, ...], list[str]] = {}

    @classmethod
    def start(
        cls, host: str, rank: int, world_size: int, timeout: timedelta, share_port: Any
    ) -> ControlPlane:
        """Create the store on rank 0 and connect the others (collective).

        Args:
            host: an address of rank 0 that every rank can reach.
            rank: this process's rank.
            world_size: number of processes.
            timeout: default timeout of store operations.
            share_port: ``share_port(port_or_None) -> port``, broadcasting rank 0's port.
        """
        import torch.distributed as dist

        if rank == 0:
            store = dist.TCPStore(
                host, 0, world_size, True, timeout=timeout, wait_for_workers=False
            )
            share_port(store.port)
        else:
            port = share_port(None)
            store = dist.TCPStore(host, port, world_size, False, timeout=timeout)
        return cls(store, rank)

    def _next(self, kind: str, members: Sequence[int]) -> tuple[str, int]:
        """The key prefix of this group's next ``kind`` call, and its sequence number."""
        key = (kind, tuple(members))
        count = self._counters.get(key, 0) + 1
        self._counters[key] = count
        return f"{_PREFIX}/{kind}/{'-'.join(map(str, members))}", count

    def barrier(self, members: Sequence[int], seconds: float, what: str) -> None:
        """Wait until every rank in ``members`` has arrived, at most ``seconds``."""
        base, count = self._next("barrier", members)
        self._store.set(f"{base}/{count}/{self._rank}", b"1")
        self._wait([f"{base}/{count}/{rank}" for rank in members], seconds, what, members)
        if count > 1:  # every member has passed the previous barrier: nobody reads its key
            self._store.delete_key(f"{base}/{count - 1}/{self._rank}")

    def exchange(
        self,
        members: Sequence[int],
        value: object,
        publish: bool,
        wait_for: Sequence[int],
        seconds: float,
        what: str,
    ) -> dict[int, object]:
        """Publish ``value`` (if ``publish``) and collect what the ranks in ``wait_for`` publish.

        Every member calls it, in the same order; it waits at most ``seconds``.

        Returns:
            rank -> the value that rank published, for every rank in ``wait_for``.
        """
        base, count = self._next("exchange", members)
        mine = f"{base}/{count}/{self._rank}"
        if publish:
            self._store.set(mine, pickle.dumps(value))
        keys = [f"{base}/{count}/{rank}" for rank in wait_for]
        self._wait(keys, seconds, what, wait_for)
        raw = self._store.multi_get(keys) if keys else []  # one round trip for every rank
        values = {rank: pickle.loads(data) for rank, data in zip(wait_for, raw, strict=True)}
        self._forget_published(tuple(members), mine if publish else None, set(wait_for))
        return values

    def _forget_published(
        self, members: tuple[int, ...], mine: str | None, heard: set[int]
    ) -> None:
        """Delete this rank's keys of earlier exchanges once nobody can still read them.

        After an exchange in which every member published and this rank heard from all of them,
        every member has finished all earlier exchanges of the group (reads included), so this
        rank's earlier keys are dead. Without this, a vote per training step would grow the store
        by one key per rank per step.
        """
        stale = self._published.setdefault(members, [])
        if mine is not None and heard >= set(members):
            for key in stale:
                self._store.delete_key(key)
            stale.clear()
        if mine is not None:
            stale.append(mine)

    def raise_flag(self, name: str) -> None:
        """Set the flag ``name`` (visible to every rank at once; it never waits)."""
        self._store.set(f"{_PREFIX}/flag/{name}", b"1")

    def flag_is_raised(self, name: str) -> bool:
        """Whether some rank raised the flag ``name`` (one store round trip; never waits)."""
        return bool(self._store.check([f"{_PREFIX}/flag/{name}"]))

    def lower_flag(self, name: str) -> None:
        """Delete the flag ``name`` (call it once no rank can still be looking at it)."""
        self._store.delete_key(f"{_PREFIX}/flag/{name}")

    def _wait(self, keys: list[str], seconds: float, what: str, ranks: Sequence[int]) -> None:
        try:
            self._store.wait(keys, timedelta(seconds=seconds))
        except RuntimeError as exc:
            if "timeout" not in str(exc).lower():
                raise RemoteError(
                    f"{what}: the control store (hosted by rank 0) stopped answering: {exc}. "
                    "HINT: rank 0 has probably exited or crashed; look at its log."
                ) from exc
            missing = [
                rank for rank, key in zip(ranks, keys, strict=True) if not self._store.check([key])
            ]
            raise DistributedTimeoutError(
                f"{what}: rank(s) {missing} did not arrive within {seconds:g} s. HINT: they are "
                "stuck, slow or dead; look at their logs, or raise the timeout if only slow."
            ) from exc
