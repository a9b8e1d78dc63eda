"""unidist's control plane: agreements over a small TCP store, each wait with its own deadline.

Collectives cannot be cancelled: a ``work.wait(timeout)`` that gives up leaves the operation
queued in gloo, and the next teardown blocks on it. Waits with their own deadline (a barrier
with ``timeout=``, ranks waiting in ``one_rank_first``, the microbatch vote) therefore go
through a ``torch.distributed.TCPStore`` that unidist owns, hosted by rank 0. A timed-out store
wait leaves nothing behind, and the arrivals recorded so far name the ranks that never came.

**The protocol** is linear in the world size W: every call costs each rank O(1) store
operations and the store O(W) work in all, so it stays cheap at thousands of ranks. The ranks of
a group count their calls (generation g) and use two slots, g % 2, of two keys each, and one key
per generation for the outcome:

1. Every rank appends a sealed record (its rank, g and its JSON value) to the slot's *arrivals*
   (``append`` sends without waiting for an answer), then adds 1 to the slot's *count* (one
   round trip). The rank whose ``add`` returns W is the last to arrive.
2. The last arrival reads the arrivals once (a barrier skips even that), combines the values,
   and in one message empties the other slot for generation g + 1 and writes the *outcome* of
   g. Every other rank waits for the outcome (one wait; and one read, unless it is a barrier).
   Everyone gets the same outcome, so everyone takes the same decision.
3. No rank enters generation g + 1 before the outcome of g exists, so the slot it uses has been
   emptied. The first rank to arrive at g, which waits anyway, deletes the outcome of g - 2:
   every rank has read it, or it could not have arrived at g - 1. A rank that timed out first
   waits, in its next call, for the generation it left (so a barrier retried after a timeout
   keeps waiting for the same ranks). The store holds six keys per group, however long the job
   runs.

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
    Records,
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
#: ``compare_set`` with this expected value reads a key in one round trip without waiting (no
#: stored value starts with 0xff: records start with a rank number below 2**24).
_NEVER = b"\xffunidist-never"
_SUCCESS = b'{"ok":null}'


@dataclass
class _Sequence:
    """One kind of call on one group, as this rank has counted it."""

    members: tuple[int, ...]
    #: Logical name of the group and kind (outcome keys are named from it).
    base: str
    counts: tuple[str, str]
    arrivals: tuple[str, str]
    generation: int = 0
    #: The generation this rank timed out of and has not seen the outcome of.
    unsettled: int | None = None


@dataclass(frozen=True)
class _Call:
    """The keys of one generation."""

    generation: int
    members: tuple[int, ...]
    arrivals: str
    count: str
    outcome: str


class ControlPlane:
    """Barriers, agreements and flags over a store, each wait with its own deadline."""

    def __init__(self, store: Any, rank: int, secret: bytes) -> None:
        self._store = store
        self._rank = rank
        self._seal = Sealer(secret)
        self._sequences: dict[tuple[str, tuple[int, ...]], _Sequence] = {}

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
        :data:`~unidist._comm.wire.MAX_OUTCOME_BYTES`) reaches every member. It must not modify
        its argument (ranks that sent equal values share one decoded value). Every member calls
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
        sequence = self._sequence(kind, members)
        payload = encode_json(value, what) if combine is not None else b""
        if sequence.unsettled is not None:  # finish the generation this rank timed out of
            self._await(self._call(sequence, sequence.unsettled), False, deadline, seconds, what)
            sequence.unsettled = None
        sequence.generation += 1
        call = self._call(sequence, sequence.generation)
        record = self._seal.record(call.arrivals, self._rank, call.generation, payload)
        try:
            # The client keeps the timeout of its last wait, which may have been short.
            self._store.set_timeout(timedelta(seconds=max(deadline - time.monotonic(), 1.0)))
            self._store.append(call.arrivals, record)
            arrived = int(self._store.add(call.count, 1))
            if arrived == 1 and call.generation > 2:  # it waits anyway: let it tidy up
                self._store.delete_key(self._call(sequence, call.generation - 2).outcome)
        except RuntimeError as exc:
            raise _store_gone(what, exc) from exc
        if arrived == len(members):
            return self._conclude(sequence, call, combine, what)
        if arrived > len(members):
            self._publish(sequence, call, _failure(_tampered(what, f"{arrived} arrivals")))
        try:
            return self._await(call, combine is not None, deadline, seconds, what)
        except DistributedTimeoutError:
            sequence.unsettled = call.generation
            raise

    def _conclude(
        self, sequence: _Sequence, call: _Call, combine: Combine | None, what: str
    ) -> Json:
        """On the last rank to arrive: combine the values and publish the outcome."""
        if combine is None:
            return self._publish(sequence, call, _SUCCESS)
        records = self._read_arrivals(call, what)
        missing = sorted(set(call.members) - set(records.payloads))
        if records.problems or missing:
            problems = [*records.problems, *([f"no record from rank(s) {missing}"] * bool(missing))]
            return self._publish(sequence, call, _failure(_tampered(what, "; ".join(problems))))
        # Ranks mostly send the same bytes (every vote "ok"): decode each distinct value once.
        decoded: dict[bytes, Json] = {}
        values: dict[int, Json] = {}
        for rank in call.members:
            payload = records.payloads[rank]
            if payload not in decoded:
                decoded[payload] = decode_json(payload)
            values[rank] = decoded[payload]
        try:
            data = encode_json({"ok": combine(values)}, what, MAX_OUTCOME_BYTES)
        except Exception as exc:  # every rank must hear about it, not only this one
            data = _failure(f"{what}: rank {self._rank} could not combine the values: {exc}")
        return self._publish(sequence, call, data)

    def _publish(self, sequence: _Sequence, call: _Call, data: bytes) -> Json:
        """Empty the other slot for the next generation, and publish the outcome (``data``).

        One message (``multi_set`` does not wait for an answer), applied in order: no rank can
        enter the next generation before its slot is empty.
        """
        following = (call.generation + 1) % 2
        keys = [sequence.arrivals[following], sequence.counts[following], call.outcome]
        try:
            self._store.multi_set(keys, [b"", b"0", self._seal.seal(call.outcome, data)])
        except RuntimeError as exc:
            raise _store_gone("publishing an outcome", exc) from exc
        return _unwrap(decode_json(data))  # what the other ranks read, to the same types

    def _await(self, call: _Call, read: bool, deadline: float, seconds: float, what: str) -> Json:
        """Wait for the outcome of ``call`` (at most until ``deadline``), and read it."""
        # Never zero: torch reads a zero timeout as "wait forever".
        left = timedelta(seconds=max(deadline - time.monotonic(), 0.001))
        try:
            if not read:  # a barrier: the outcome's existence is the whole message
                self._store.wait([call.outcome], left)
                return None
            self._store.set_timeout(left)
            data = bytes(self._store.get(call.outcome))
        except RuntimeError as exc:
            if "timeout" not in str(exc).lower():
                raise _store_gone(what, exc) from exc
            raise self._timed_out(call, seconds, what) from exc
        payload = self._seal.open(call.outcome, data)
        if payload is None:
            raise RemoteError(_tampered(what, "an outcome without this job's seal"))
        return _unwrap(decode_json(payload))

    def _read_arrivals(self, call: _Call, what: str) -> Records:
        """The records of ``call`` (one round trip, no waiting: this rank's record is there)."""
        try:
            data = bytes(self._store.compare_set(call.arrivals, _NEVER, _NEVER))
        except RuntimeError as exc:
            raise _store_gone(what, exc) from exc
        if data == _NEVER:
            data = b""
        return self._seal.read_records(call.arrivals, data, call.generation, call.members)

    def _timed_out(self, call: _Call, seconds: float, what: str) -> DistributedTimeoutError:
        """The error for a wait that ran out: it names the ranks that never arrived."""
        try:
            came = set(self._read_arrivals(call, what).payloads)
        except RemoteError:
            came = set()
        missing = [rank for rank in call.members if rank not in came]
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

    def _sequence(self, kind: str, members: tuple[int, ...]) -> _Sequence:
        sequence = self._sequences.get((kind, members))
        if sequence is None:
            packed = struct.pack(f">{len(members)}I", *members)
            base = f"{kind}/{hashlib.blake2b(packed, digest_size=8).hexdigest()}"
            name = self._seal.name
            sequence = self._sequences[(kind, members)] = _Sequence(
                members,
                base,
                counts=(name(f"{base}/count/0"), name(f"{base}/count/1")),
                arrivals=(name(f"{base}/arrivals/0"), name(f"{base}/arrivals/1")),
            )
        return sequence

    def _call(self, sequence: _Sequence, generation: int) -> _Call:
        slot = generation % 2
        return _Call(
            generation,
            sequence.members,
            sequence.arrivals[slot],
            sequence.counts[slot],
            self._seal.name(f"{sequence.base}/outcome/{generation}"),
        )

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


def _failure(message: str) -> bytes:
    """The outcome that makes every rank raise :class:`RemoteError` with ``message``."""
    return encode_json({"error": message[:100_000]}, "an error", MAX_OUTCOME_BYTES)


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
