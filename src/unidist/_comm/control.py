"""unidist's control plane: agreements over a small TCP store, each wait with its own deadline.

Collectives cannot be cancelled: a ``work.wait(timeout)`` that gives up leaves the operation
queued in gloo, and the next teardown blocks on it. Waits with their own deadline (a barrier
with ``timeout=``, ranks waiting in ``one_rank_first``, the microbatch vote) therefore go
through a ``torch.distributed.TCPStore`` that unidist owns, hosted by rank 0. A timed-out store
wait leaves nothing behind, and the arrivals recorded so far name the ranks that never came.

**The protocol** is linear in the world size W: every call costs each rank O(1) store
operations and the store O(W) work in all, so it stays cheap at thousands of ranks. Each call on
a group has a generation g (the ranks count their calls), and three keys:

1. Every rank appends a sealed record (its rank and its JSON value) to the *arrivals* key
   (``append`` sends without waiting for an answer), then adds 1 to the *count* key (one round
   trip). The rank whose ``add`` returns W is the last to arrive.
2. The last arrival reads the arrivals once (a barrier skips even that), combines the values
   and writes the *outcome* key; every other rank waits for the outcome (one wait, one read).
   Everyone gets the same outcome, so everyone takes the same decision.
3. The first rank to arrive at generation g deletes generation g - 2's keys while it waits:
   every rank has finished g - 1, so none can still read them. The store holds at most three
   generations per group, however long the job runs.

Only the error path costs more: a rank that times out reads the arrivals to name the ranks
that are missing.

**Trust.** The store is reachable by other processes (see :mod:`unidist._comm.listen` for where
it listens, and :mod:`unidist._comm.wire` for how keys and values are sealed): nothing read from
it is unpickled, every value must carry the job's seal, and key names cannot be predicted
without the job's secret, which rank 0 draws and sends over the process group.
"""

from __future__ import annotations

import hashlib
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from unidist._comm import listen
from unidist._comm.wire import (
    MAX_OUTCOME_BYTES,
    SECRET_BYTES,
    Json,
    Sealer,
    decode_json,
    encode_json,
    new_secret,
)
from unidist.errors import DistributedTimeoutError, RemoteError

__all__ = ["Combine", "ControlPlane"]

#: ``combine(values)``: rank -> that rank's value, for every member; returns the outcome.
Combine = Callable[[dict[int, Json]], Json]
#: Rank 0's start-up message: status, port, secret, address length (the address follows).
_START = struct.Struct(f">BH{SECRET_BYTES}sB")
#: Seconds the error path spends reading the arrivals to name the missing ranks.
_DIAGNOSIS_SECONDS = 5.0


@dataclass(frozen=True)
class _Keys:
    arrivals: str
    count: str
    outcome: str
    #: The keys of generation g - 2, deleted by the first arrival of generation g.
    stale: tuple[str, ...]


class ControlPlane:
    """Barriers, agreements and flags over a store, each wait with its own deadline."""

    def __init__(self, store: Any, rank: int, secret: bytes) -> None:
        self._store = store
        self._rank = rank
        self._seal = Sealer(secret)
        self._generations: dict[tuple[str, tuple[int, ...]], int] = {}
        self._group_ids: dict[tuple[int, ...], str] = {}

    @classmethod
    def start(
        cls,
        rank: int,
        timeout: timedelta,
        hosts: tuple[str, ...],
        share: Callable[[bytes | None], bytes],
    ) -> ControlPlane:
        """Start the store on rank 0 and connect the others (collective).

        Args:
            rank: this process's rank.
            timeout: default timeout of store operations.
            hosts: where rank 0 may listen, in order of preference (see
                :func:`unidist._comm.listen.serve`).
            share: ``share(message_or_None) -> message``, broadcasting rank 0's bytes over the
                process group (never through the store: the secret travels in it).
        """
        if rank != 0:
            address, port, secret = _read_start(share(None))
            return cls(listen.connect(address, port, timeout), rank, secret)
        try:
            store, address = listen.serve(hosts, timeout)
        except Exception as exc:
            share(_failed_start(str(exc)))  # the others fail at once instead of waiting
            raise
        secret = new_secret()
        share(_START.pack(1, store.port, secret, len(address.encode())) + address.encode())
        return cls(store, rank, secret)

    # -- agreements --------------------------------------------------------------------------

    def barrier(self, members: Sequence[int], seconds: float, what: str) -> None:
        """Wait until every rank in ``members`` has arrived, at most ``seconds``."""
        self._run("barrier", tuple(members), None, None, seconds, what)

    def agree(
        self, members: Sequence[int], value: Json, combine: Combine, seconds: float, what: str
    ) -> Json:
        """Every member contributes ``value``; every member gets ``combine`` of all of them.

        ``combine`` runs once, on the last rank to arrive, and its result (JSON, at most
        :data:`~unidist._comm.wire.MAX_OUTCOME_BYTES`) reaches every member. Every member calls
        it, in the same order; it waits at most ``seconds``.
        """
        return self._run("agree", tuple(members), value, combine, seconds, what)

    def exchange(
        self,
        members: Sequence[int],
        value: Json,
        publish: bool,
        wait_for: Sequence[int],
        seconds: float,
        what: str,
    ) -> dict[int, Json]:
        """An agreement in which some ranks publish a value and each rank reads some of them.

        Returns:
            rank -> the value that rank published, for every rank in ``wait_for``.
        """
        published = self.agree(members, [value] if publish else None, _published, seconds, what)
        assert isinstance(published, dict)
        silent = [rank for rank in wait_for if str(rank) not in published]
        if silent:
            raise RemoteError(
                f"{what}: rank(s) {silent} arrived without publishing a value; the ranks do not "
                "agree on who publishes. HINT: every rank must name the same publishers."
            )
        return {rank: published[str(rank)] for rank in wait_for}

    def _run(
        self,
        kind: str,
        members: tuple[int, ...],
        value: Json,
        combine: Combine | None,
        seconds: float,
        what: str,
    ) -> Json:
        deadline = time.monotonic() + seconds
        keys = self._keys(kind, members)
        payload = encode_json(value, what) if combine is not None else b""
        store = self._store
        try:
            store.append(keys.arrivals, self._seal.record(keys.arrivals, self._rank, payload))
            arrived = int(store.add(keys.count, 1))
            if arrived == 1:
                for key in keys.stale:
                    store.delete_key(key)
        except RuntimeError as exc:
            raise _store_gone(what, exc) from exc
        if arrived == len(members):
            return self._conclude(keys, members, combine, deadline, what)
        if arrived > len(members):
            self._conclude_with(keys, {"error": _tampered(what, f"{arrived} arrivals")})
        return self._await(keys, members, combine is not None, deadline, seconds, what)

    def _conclude(
        self,
        keys: _Keys,
        members: tuple[int, ...],
        combine: Combine | None,
        deadline: float,
        what: str,
    ) -> Json:
        """On the last rank to arrive: combine the values and publish the outcome."""
        if combine is None:
            return self._conclude_with(keys, {"ok": None})
        try:
            self._store.set_timeout(timedelta(seconds=max(deadline - time.monotonic(), 1.0)))
            data = bytes(self._store.get(keys.arrivals))
        except RuntimeError as exc:
            raise _store_gone(what, exc) from exc
        records = self._seal.read_records(keys.arrivals, data, members)
        missing = sorted(set(members) - set(records.payloads))
        if records.problems or missing:
            problems = [*records.problems, *([f"no record from rank(s) {missing}"] * bool(missing))]
            return self._conclude_with(keys, {"error": _tampered(what, "; ".join(problems))})
        values = {rank: decode_json(records.payloads[rank]) for rank in members}
        try:
            envelope: dict[str, Json] = {"ok": combine(values)}
            encode_json(envelope, what, MAX_OUTCOME_BYTES)
        except Exception as exc:  # every rank must hear about it, not only this one
            envelope = {"error": f"{what}: rank {self._rank} could not combine the values: {exc}"}
        return self._conclude_with(keys, envelope)

    def _conclude_with(self, keys: _Keys, envelope: dict[str, Json]) -> Json:
        data = encode_json(envelope, "the outcome", MAX_OUTCOME_BYTES)
        try:
            self._store.set(keys.outcome, self._seal.seal(keys.outcome, data))
        except RuntimeError as exc:
            raise _store_gone("publishing an outcome", exc) from exc
        return _unwrap(decode_json(data))  # what the other ranks read, to the same types

    def _await(
        self,
        keys: _Keys,
        members: tuple[int, ...],
        read: bool,
        deadline: float,
        seconds: float,
        what: str,
    ) -> Json:
        """On every other rank: wait for the outcome (at most until ``deadline``) and read it."""
        left = timedelta(seconds=max(deadline - time.monotonic(), 0.0))
        try:
            if not read:  # a barrier: the outcome's existence is the whole message
                self._store.wait([keys.outcome], left)
                return None
            self._store.set_timeout(left)
            data = bytes(self._store.get(keys.outcome))
        except RuntimeError as exc:
            if "timeout" not in str(exc).lower():
                raise _store_gone(what, exc) from exc
            raise self._timed_out(keys, members, seconds, what) from exc
        payload = self._seal.open(keys.outcome, data)
        if payload is None:
            raise RemoteError(_tampered(what, "an outcome without this job's seal"))
        return _unwrap(decode_json(payload))

    def _timed_out(
        self, keys: _Keys, members: tuple[int, ...], seconds: float, what: str
    ) -> DistributedTimeoutError:
        """The error for a wait that ran out: it names the ranks that never arrived."""
        try:
            self._store.set_timeout(timedelta(seconds=_DIAGNOSIS_SECONDS))
            data = bytes(self._store.get(keys.arrivals))
            came = set(self._seal.read_records(keys.arrivals, data, members).payloads)
        except RuntimeError:
            came = set()
        missing = [rank for rank in members if rank not in came]
        if not missing:
            return DistributedTimeoutError(
                f"{what}: every rank arrived, but the outcome did not come within {seconds:g} "
                "s. HINT: the last rank to arrive died before it published the outcome; look at "
                "the logs of the ranks that stopped."
            )
        return DistributedTimeoutError(
            f"{what}: rank(s) {missing} did not arrive within {seconds:g} s. HINT: they are "
            "stuck, slow or dead; look at their logs, or raise the timeout if only slow."
        )

    def _keys(self, kind: str, members: tuple[int, ...]) -> _Keys:
        """The keys of this group's next ``kind`` call (and of the generation before last)."""
        group = self._group_ids.get(members)
        if group is None:
            digest = hashlib.blake2b(struct.pack(f">{len(members)}I", *members), digest_size=8)
            group = self._group_ids[members] = digest.hexdigest()
        generation = self._generations.get((kind, members), 0) + 1
        self._generations[(kind, members)] = generation

        def names(g: int) -> tuple[str, str, str]:
            base = f"{kind}/{group}/{g}/"
            name = self._seal.name
            return name(base + "arrivals"), name(base + "count"), name(base + "outcome")

        arrivals, count, outcome = names(generation)
        stale = names(generation - 2) if generation > 2 else ()
        return _Keys(arrivals, count, outcome, stale)

    # -- flags -------------------------------------------------------------------------------

    def raise_flag(self, name: str) -> None:
        """Set the flag ``name`` (visible to every rank at once; it never waits)."""
        self._store.set(self._seal.name(f"flag/{name}"), b"1")

    def flag_is_raised(self, name: str) -> bool:
        """Whether some rank raised the flag ``name`` (one store round trip; never waits)."""
        return bool(self._store.check([self._seal.name(f"flag/{name}")]))

    def lower_flag(self, name: str) -> None:
        """Delete the flag ``name`` (call it once no rank can still be looking at it)."""
        self._store.delete_key(self._seal.name(f"flag/{name}"))


def _published(values: dict[int, Json]) -> Json:
    """Combine for :meth:`ControlPlane.exchange`: the published values, by rank."""
    return {
        str(rank): value[0]
        for rank, value in values.items()
        if isinstance(value, list) and len(value) == 1
    }


def _unwrap(envelope: Json) -> Json:
    """The outcome in a sealed envelope (``{"ok": outcome}``), or raise the error it carries."""
    if isinstance(envelope, dict) and len(envelope) == 1:
        if "ok" in envelope:
            return envelope["ok"]
        if "error" in envelope:
            raise RemoteError(str(envelope["error"]))
    raise RemoteError(f"unidist's control store holds a malformed outcome: {envelope!r:.200}")


def _tampered(what: str, found: str) -> str:
    return (
        f"{what}: unidist's control store holds data this job did not write ({found}). "
        "HINT: another process is writing to the store; keep the job's hosts and ports private "
        "(see the trust model in unidist's docs)."
    )


def _store_gone(what: str, exc: BaseException) -> RemoteError:
    return RemoteError(
        f"{what}: the control store (hosted by rank 0) stopped answering: {exc}. "
        "HINT: rank 0 has probably exited or crashed; look at its log."
    )


def _failed_start(message: str) -> bytes:
    text = message.encode()[:4000]
    return struct.pack(">BH", 2, len(text)) + text


def _read_start(data: bytes) -> tuple[str, int, bytes]:
    """Rank 0's start-up message: (address, port, secret); raise if rank 0 failed."""
    status = data[0]
    if status == 2:
        (length,) = struct.unpack_from(">H", data, 1)
        raise RemoteError(
            "rank 0 could not start unidist's control store: "
            f"{data[3 : 3 + length].decode(errors='replace')}"
        )
    _, port, secret, length = _START.unpack_from(data)
    address = data[_START.size : _START.size + length].decode()
    return address, port, secret
