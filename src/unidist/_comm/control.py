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
   (``append`` sends without waiting for an answer), then adds to the slot's *count* (one
   round trip). The rank whose ``add`` returns a total of W arrivals is the last to arrive.
2. The last arrival reads the arrivals once, combines the values, and in one message empties
   the other slot for generation g + 1 and writes the *outcome* of g. Every other rank waits
   for the outcome (one wait; and one read, unless it is a barrier). Everyone gets the same
   outcome, so everyone takes the same decision.
3. No rank enters generation g + 1 before the outcome of g exists, so the slot it uses has been
   emptied. The first rank to arrive at g, which waits anyway, deletes the outcome of g - 2:
   every rank has read it, or it could not have arrived at g - 1. A rank that timed out first
   waits, in its next call, for the generation it left (so a barrier retried after a timeout
   keeps waiting for the same ranks). The store holds six keys per group, however long the job
   runs.

**The fast path.** A barrier never reads the arrivals. An agreement need not either when every
rank sent the value the caller declared :class:`Usual` (the MicroBatcher's "ok, same size as
last step", ``one_rank_first``'s "done"): a rank with any other value adds a mark to the count
with its arrival, so the last arrival knows from its ``add`` alone whether every value is the
usual one, and then combines the usual values without reading them. Each rank adds a multiple of
a number K drawn from the secret, the generation and the usual values (one arrival is K, an
unusual value adds K * 2**21 more): a total that is not a multiple of K, or that counts more
than W arrivals, ends the call with an error on every rank instead of a decision, so a process
that adds to the count (it would need the secret key name first), or ranks that declared
different usual values, cannot make the fast path skip a value.

Only the error path costs more: a rank that times out reads the arrivals to name the ranks
that are missing (every rank still appends its record, usual or not).

**Trust.** The store is reachable by other processes (see :mod:`unidist._comm.listen` for where
it listens, and :mod:`unidist._comm.wire` for how keys and values are sealed): nothing read from
it is unpickled, every value must carry the job's seal, and key names cannot be predicted
without the job's secret, which rank 0 draws and sends over the process group.
"""

from __future__ import annotations

import functools
import hashlib
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
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

__all__ = ["Combine", "ControlPlane", "Usual"]

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
#: An unusual value adds ``_MARK`` arrivals' worth to the count (more than any world size).
_MARK = 2**21
#: Largest group with a fast path (the count must fit in a signed 64-bit integer: K < 2**21,
#: and at most W * (1 + _MARK) arrivals' worth).
_FAST_MAX_MEMBERS = 2**20


@dataclass(frozen=True)
class Usual:
    """The value each member sends when nothing happened: ``value``, or ``exceptions[rank]``.

    Every member must pass an equal ``Usual`` (derived from what they already agree on): when
    every value is the usual one, the last rank to arrive combines these without reading what
    the ranks sent.
    """

    value: Json
    exceptions: Mapping[int, Json] = field(default_factory=dict)

    def encoded(self, rank: int) -> bytes:
        """The usual value of ``rank``, as that rank sends it."""
        if rank in self.exceptions:
            return encode_json(self.exceptions[rank], "a usual value")
        return self._value

    @functools.cached_property
    def _value(self) -> bytes:  # a MicroBatcher reuses one Usual from step to step
        return encode_json(self.value, "a usual value")

    def decoded(self, members: Sequence[int]) -> dict[int, Json]:
        """The usual values of ``members`` as the other ranks' values are read: decoded JSON
        (so combine sees the same types either way), one shared object for the common one."""
        common = decode_json(self._value)
        return {
            rank: decode_json(self.encoded(rank)) if rank in self.exceptions else common
            for rank in members
        }

    @functools.cached_property
    def spec(self) -> bytes:
        """The usual values as bytes, the same on every member that passed an equal one."""
        exceptions = [[rank, self.exceptions[rank]] for rank in sorted(self.exceptions)]
        return encode_json([self.value, exceptions], "the usual values", MAX_OUTCOME_BYTES)


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
    #: The last fast-path outcome: (usual spec, combine, outcome bytes); combine is pure.
    fast: tuple[bytes, Combine, bytes] | None = None


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
        self,
        members: Sequence[int],
        value: Json,
        combine: Combine,
        seconds: float,
        what: str,
        usual: Usual | None = None,
    ) -> Json:
        """Every member contributes ``value``; every member gets ``combine`` of all of them.

        ``combine`` runs once, on the last rank to arrive, and its result (JSON, at most
        :data:`~unidist._comm.wire.MAX_OUTCOME_BYTES`) reaches every member. It must be a pure
        function and must not modify its argument (ranks that sent equal values share one
        decoded value). Every member calls it, in the same order, with an equal ``usual`` (see
        :class:`Usual`: when every value is the usual one, the last rank skips reading them);
        it waits at most ``seconds``.
        """
        return self._run("agree", tuple(members), value, combine, seconds, what, usual)

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
        # The usual case (one_rank_first's "done"): the ranks in wait_for publish None.
        usual = Usual(None, {rank: [None] for rank in wait_for})
        mine = [value] if publish else None
        published = self.agree(members, mine, _published, seconds, what, usual)
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
        usual: Usual | None = None,
    ) -> Json:
        deadline = time.monotonic() + seconds
        sequence = self._sequence(kind, members)
        payload = encode_json(value, what) if combine is not None else b""
        if len(members) > _FAST_MAX_MEMBERS:
            usual = None
        spec = usual.spec if usual is not None else b""
        unusual = usual is not None and payload != usual.encoded(self._rank)
        if sequence.unsettled is not None:  # finish the generation this rank timed out of
            self._await(self._call(sequence, sequence.unsettled), False, deadline, seconds, what)
            sequence.unsettled = None
        sequence.generation += 1
        call = self._call(sequence, sequence.generation)
        record = self._seal.record(call.arrivals, self._rank, call.generation, payload)
        unit = self._seal.unit(call.count, call.generation, spec)
        try:
            # The client keeps the timeout of its last wait, which may have been short.
            self._store.set_timeout(timedelta(seconds=max(deadline - time.monotonic(), 1.0)))
            self._store.append(call.arrivals, record)
            total = int(self._store.add(call.count, unit * (1 + _MARK * unusual)))
        except RuntimeError as exc:
            raise _store_gone(what, exc) from exc
        marks, arrived = divmod(total // unit, _MARK)
        if total % unit or not 0 < arrived <= len(members) or not 0 <= marks <= arrived:
            # Another process added to the count, or the ranks declared different usual values.
            found = f"a count of {total}, not one its ranks can add up to"
            self._publish(sequence, call, _failure(_tampered(what, found, disagree=True)))
        else:
            if arrived == 1 and call.generation > 2:  # it waits anyway: let it tidy up
                self._delete(self._call(sequence, call.generation - 2).outcome, what)
            if arrived == len(members):
                fast = usual if marks == 0 else None
                return self._conclude(sequence, call, combine, what, fast, spec)
        try:
            return self._await(call, combine is not None, deadline, seconds, what)
        except DistributedTimeoutError:
            sequence.unsettled = call.generation
            raise

    def _delete(self, key: str, what: str) -> None:
        try:
            self._store.delete_key(key)
        except RuntimeError as exc:
            raise _store_gone(what, exc) from exc

    def _conclude(
        self,
        sequence: _Sequence,
        call: _Call,
        combine: Combine | None,
        what: str,
        usual: Usual | None,
        spec: bytes,
    ) -> Json:
        """On the last rank to arrive: combine the values and publish the outcome.

        With ``usual`` (every rank counted its value as the usual one), the values are not read.
        """
        if combine is None:
            return self._publish(sequence, call, _SUCCESS)
        if usual is not None:
            if sequence.fast is None or sequence.fast[:2] != (spec, combine):
                outcome = self._combined(combine, usual.decoded(call.members), what)
                sequence.fast = (spec, combine, outcome)
            return self._publish(sequence, call, sequence.fast[2])
        records = self._read_arrivals(call, what)
        missing = sorted(set(call.members) - set(records.payloads))
        if records.problems or missing:
            problems = [*records.problems, *([f"no record from rank(s) {missing}"] * bool(missing))]
            failure = _failure(_tampered(what, "; ".join(problems)))
            return self._publish(sequence, call, failure)
        # Ranks mostly send the same bytes (every vote "ok"): decode each distinct value once.
        decoded: dict[bytes, Json] = {}
        values: dict[int, Json] = {}
        for rank in call.members:
            payload = records.payloads[rank]
            if payload not in decoded:
                decoded[payload] = decode_json(payload)
            values[rank] = decoded[payload]
        return self._publish(sequence, call, self._combined(combine, values, what))

    def _combined(self, combine: Combine, values: dict[int, Json], what: str) -> bytes:
        """The outcome of ``combine(values)`` to publish (a failure if combine raises)."""
        try:
            return encode_json({"ok": combine(values)}, what, MAX_OUTCOME_BYTES)
        except Exception as exc:  # every rank must hear about it, not only this one
            return _failure(f"{what}: rank {self._rank} could not combine the values: {exc}")

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


def _tampered(what: str, found: str, disagree: bool = False) -> str:
    cause = (
        "the ranks called it with different usual values (a bug), or another process is "
        "writing to the store"
        if disagree
        else "another process is writing to the store"
    )
    return (
        f"{what}: unidist's control store holds data this job did not write ({found}). "
        f"HINT: {cause}; keep the job's hosts and ports private (see the trust model in "
        "unidist's docs)."
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
