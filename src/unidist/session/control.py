"""unidist's control plane: agreements over a small TCP store, each wait with its own deadline.

Collectives cannot be cancelled: a ``work.wait(timeout)`` that gives up leaves the operation
queued in gloo, and the next teardown blocks on it. Waits with their own deadline (a barrier
with ``timeout=``, ranks waiting in ``one_rank_first``, the microbatch vote) therefore go
through a ``torch.distributed.TCPStore`` that unidist owns, hosted by rank 0. A timed-out store
wait leaves nothing behind, and the arrivals recorded so far name the ranks that never came.

**The protocol** is linear in the world size W: every call costs each rank O(1) store
operations and the store O(W) work in all, so it stays cheap at thousands of ranks. The ranks of
a group count their calls (generation g) and use three slots, g % 3, of two keys each, and one
key per generation for the outcome:

1. Every rank appends a sealed record (its rank, g and its JSON value) to the slot's *arrivals*
   (``append`` sends without waiting for an answer), then adds to the slot's *count* (one
   round trip). The count says when to look, never what was decided: a rank whose ``add``
   returns W arrivals reads the sealed records and decides from them alone.
2. That rank combines the values and, in one message, empties the slot of generation g + 2 and
   writes the sealed *outcome* of g. Every other rank waits for the outcome (one wait; and one
   read, unless it is a barrier). Everyone gets the same outcome, so everyone takes the same
   decision. Publishing is idempotent: were two ranks ever to conclude (another process adding
   to the count can make an early rank see W arrivals), both write the same bytes, and the slot
   they empty is one no rank can have reached yet (g + 2 needs every rank's arrival at g + 1,
   which each sends after its own publication).
3. No rank enters generation g + 1 before the outcome of g exists. The first rank to arrive at
   g, which waits anyway, deletes the outcome of g - 2: every rank has read it, or it could not
   have arrived at g - 1. A rank that timed out first waits, in its next call, for the
   generation it left (so a barrier retried after a timeout keeps waiting for the same ranks).
   The store holds seven keys per group, however long the job runs.

**The fast path.** A rank that sends the value the caller declared expected
(:class:`ExpectedValues`: the MicroBatcher's "ok, same size as last step", ``one_rank_first``'s
"done", every barrier arrival) adds its secret *tag* to the count with its arrival
(:meth:`~unidist.session.wire.Sealer.tags`: a keyed hash of the call and the rank, above the arrival
bits). A count that holds exactly W arrivals and the sum of every member's tag proves that every
member sent its expected value, so the last rank combines the expected values without reading the
records. Any other total makes it read the sealed records and decide from them; a total that the
records do not add up to (another process added to the count) ends the call with an error on every
rank. Nothing another process can add makes a count look complete without the secret: it would have
to guess a tag (one chance in 2**39 at 1,024 ranks, 2**57 at 2, and a wrong guess is detected and
fails the job).

Only the error path costs more: a rank that times out reads the arrivals to name the ranks
that are missing (every rank still appends its record, expected or not).

**Deadlines.** Every round trip has one (:mod:`unidist.session.link`): a stopped store host is
named by every rank within the caller's timeout plus
:data:`~unidist.session.link.UNANSWERED_BOUND`.

**Trust.** The store is reachable by other processes (see :mod:`unidist.session.listen` for where
it listens, and :mod:`unidist.session.wire` for how keys and values are sealed): nothing read from
it is unpickled, every value must carry the job's seal, and key names cannot be predicted
without the job's secret, which rank 0 draws and sends over the process group. From torch 2.10
on another process can list the keys; it still cannot change a decision (above), only make the
job fail.
"""

from __future__ import annotations

import functools
import hashlib
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from unidist.errors import (
    DistributedTimeoutError,
    RemoteError,
    TorchFailure,
    UnidistError,
    torch_failure,
)
from unidist.session import listen
from unidist.session.link import UNANSWERED_BOUND, Link
from unidist.session.wire import (
    MAX_OUTCOME_BYTES,
    SECRET_BYTES,
    Json,
    Records,
    Sealer,
    decode_json,
    encode_json,
    new_secret,
)

__all__ = ["Combine", "ControlPlane", "ExpectedValues"]

#: ``combine(values)``: rank -> that rank's value, for every member; returns the outcome.
Combine = Callable[[dict[int, Json]], Json]
#: Rank 0's start-up message: status, port, secret, address length (the address follows).
_START = struct.Struct(f">BH{SECRET_BYTES}sB")
#: ``compare_set`` with this expected value reads a key in one round trip without waiting (no
#: stored value starts with 0xff: records start with a rank number below 2**24).
_NEVER = b"\xffunidist-never"
_SUCCESS = b'{"ok":null}'
#: Slots of arrivals and counts per group (see the protocol: the concluder empties g + 2's).
_SLOTS = 3
#: Largest group with a fast path: its tags keep at least 27 bits (see :func:`_layout`).
_FAST_MAX_MEMBERS = 2**16
#: What barriers expect: every arrival is (no values travel).
_BARRIER_SPEC = b"barrier"


@dataclass(frozen=True)
class ExpectedValues:
    """The value each member sends when nothing happened: ``value``, or ``exceptions[rank]``.

    Every member must pass an equal ``ExpectedValues`` (derived from what they already agree
    on): when every value is the expected one, the last rank to arrive combines these without
    reading what the ranks sent.
    """

    value: Json
    exceptions: Mapping[int, Json] = field(default_factory=dict)

    def encoded(self, rank: int) -> bytes:
        """The expected value of ``rank``, as that rank sends it."""
        if rank in self.exceptions:
            return encode_json(self.exceptions[rank], "an expected value")
        return self._value

    @functools.cached_property
    def _value(self) -> bytes:  # a MicroBatcher reuses one ExpectedValues from step to step
        return encode_json(self.value, "an expected value")

    def decoded(self, members: Sequence[int]) -> dict[int, Json]:
        """The expected values of ``members`` as the other ranks' values are read: decoded JSON
        (so combine sees the same types either way), one shared object for the common one."""
        common = decode_json(self._value)
        return {
            rank: decode_json(self.encoded(rank)) if rank in self.exceptions else common
            for rank in members
        }

    @functools.cached_property
    def spec(self) -> bytes:
        """The expected values as bytes, the same on every member that passed an equal one."""
        exceptions = [[rank, self.exceptions[rank]] for rank in sorted(self.exceptions)]
        return encode_json([self.value, exceptions], "the expected values", MAX_OUTCOME_BYTES)


def _layout(members: int) -> tuple[int, int]:
    """(shift, bits): arrivals take the low ``shift`` bits of a count, tags ``bits`` above.

    The sum of ``members`` arrivals and tags stays below 2**62, so no count overflows torch's
    64-bit ``add``: 57 tag bits for 2 ranks, 39 for 1,024, 27 for 65,536.
    """
    width = members.bit_length()
    return width + 1, 61 - 2 * width


@dataclass
class _Sequence:
    """One kind of call on one group, as this rank has counted it."""

    members: tuple[int, ...]
    #: Logical name of the group and kind (outcome keys are named from it).
    base: str
    counts: tuple[str, ...]
    arrivals: tuple[str, ...]
    generation: int = 0
    #: The generation this rank timed out of and has not seen the outcome of.
    unsettled: int | None = None
    #: The last fast-path outcome: (expected spec, combine, outcome bytes); combine is pure.
    fast: tuple[bytes, Combine, bytes] | None = None


@dataclass(frozen=True)
class _Call:
    """The keys of one generation, and how this rank's arrival is counted."""

    generation: int
    members: tuple[int, ...]
    arrivals: str
    count: str
    outcome: str
    #: Where a barrier's refusal goes (a barrier's outcome key only ever holds success).
    refusal: str
    #: The expected values' bytes (empty: no fast path), and the count's layout.
    spec: bytes = b""
    shift: int = 0
    bits: int = 0


class ControlPlane:
    """Barriers, agreements and flags over a store, each wait with its own deadline."""

    def __init__(self, link: Link, rank: int, secret: bytes) -> None:
        self._link = link
        self._store = link.store
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
            timeout: default timeout of store operations, and of connecting.
            hosts: where rank 0 may listen, in order of preference (see
                :func:`unidist.session.listen.serve`).
            share: ``share(message_or_None) -> message``, broadcasting rank 0's bytes over the
                process group (never through the store: the secret travels in it).
        """
        if rank != 0:
            address, port, secret = _read_start(share(None))
            return cls(listen.connect(address, port, timeout), rank, secret)
        try:
            link, address = listen.serve(hosts, timeout)
        except Exception as exc:
            share(_failed_start(str(exc)))  # the others fail at once instead of waiting
            raise
        secret = new_secret()
        port = link.store.port
        share(_START.pack(1, port, secret, len(address.encode())) + address.encode())
        return cls(link, rank, secret)

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
        expected: ExpectedValues | None = None,
    ) -> Json:
        """Every member contributes ``value``; every member gets ``combine`` of all of them.

        ``combine`` runs once, on the last rank to arrive, and its result (JSON, at most
        :data:`~unidist.session.wire.MAX_OUTCOME_BYTES`) reaches every member. It must be a pure
        function and must not modify its argument (ranks that sent equal values share one
        decoded value). Every member calls it, in the same order, with an equal ``expected``
        (see :class:`ExpectedValues`: when every value is the expected one, the last rank skips
        reading them); it waits at most ``seconds``.
        """
        return self._run("agree", tuple(members), value, combine, seconds, what, expected)

    def exchange(
        self,
        members: Sequence[int],
        value: Json,
        *,
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
        expected = ExpectedValues(None, {rank: [None] for rank in wait_for})
        mine = [value] if publish else None
        published = self.agree(members, mine, _published, seconds, what, expected)
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
        expected: ExpectedValues | None = None,
    ) -> Json:
        deadline = time.monotonic() + seconds
        sequence = self._sequence(kind, members)
        payload = encode_json(value, what) if combine is not None else b""
        self._link.limit(seconds + UNANSWERED_BOUND)  # raises if the store stopped answering
        if sequence.unsettled is not None:  # finish the generation this rank timed out of
            self._await(self._call(sequence, sequence.unsettled), False, deadline, seconds, what)
            sequence.unsettled = None
            self._link.limit(deadline - time.monotonic() + UNANSWERED_BOUND)
        sequence.generation += 1
        call = self._call(sequence, sequence.generation, combine, expected)
        contribution = 1
        if call.spec and (combine is None or payload == expected.encoded(self._rank)):  # type: ignore[union-attr]
            [tag] = self._seal.tags(call.count, call.generation, call.spec, [self._rank], call.bits)
            contribution += tag << call.shift
        record = self._seal.record(call.arrivals, self._rank, call.generation, payload)
        try:
            self._store.append(call.arrivals, record)
            total = int(self._store.add(call.count, contribution))
            arrived = total & ((1 << call.shift) - 1) if call.spec else total
            if arrived == 1 and call.generation > 2:  # it waits anyway: let it tidy up
                self._store.delete_key(self._call(sequence, call.generation - 2).outcome)
        except RuntimeError as exc:
            raise self._failed(exc, what) from exc
        if arrived == len(members):  # time to look; the sealed records decide
            decided = self._conclude(sequence, call, combine, expected, total, what)
            return _unwrap(decode_json(decided))  # what the others read, to the same types
        try:
            return self._await(call, combine is not None, deadline, seconds, what)
        except DistributedTimeoutError:
            if not self._link.broken:
                sequence.unsettled = call.generation
            raise

    def _conclude(
        self,
        sequence: _Sequence,
        call: _Call,
        combine: Combine | None,
        expected: ExpectedValues | None,
        total: int,
        what: str,
    ) -> bytes:
        """On the rank whose count says every member arrived: decide, and publish the outcome.

        Returns the published outcome (for a barrier that finds the store tampered with, it
        raises instead: its outcome key only ever means success).
        """
        members = call.members
        tags: list[int] = []
        if call.spec:
            tags = self._seal.tags(call.count, call.generation, call.spec, members, call.bits)
            if total == len(members) + (sum(tags) << call.shift):
                # Every member added its tag: every value is the expected one; no need to read.
                if combine is None:
                    return self._publish(sequence, call, _SUCCESS)
                assert expected is not None
                if sequence.fast is None or sequence.fast[:2] != (call.spec, combine):
                    outcome = self._combined(combine, expected.decoded(members), what)
                    sequence.fast = (call.spec, combine, outcome)
                return self._publish(sequence, call, sequence.fast[2])
        records = self._read_arrivals(call, what)
        missing = sorted(set(members) - set(records.payloads))
        if records.problems or missing:
            # Every rank appends before it counts itself, and the store applies one client's
            # messages in order: a count of W with a record missing was added to by another
            # process.
            problems = [*records.problems, *([f"no record of rank(s) {missing}"] * bool(missing))]
            return self._refuse(sequence, call, "; ".join(problems), what)
        due = len(members)  # what the count must hold, by the records
        for rank, tag in zip(members, tags, strict=False):  # no tags: no fast path
            if combine is None or records.payloads[rank] == expected.encoded(rank):  # type: ignore[union-attr]
                due += tag << call.shift
        if total != due:
            found = f"a count of {total}, not what the ranks' sealed records add up to"
            return self._refuse(sequence, call, found, what, disagree=True)
        if combine is None:
            return self._publish(sequence, call, _SUCCESS)
        # Ranks mostly send the same bytes (every vote "ok"): decode each distinct value once.
        decoded: dict[bytes, Json] = {}
        values: dict[int, Json] = {}
        for rank in members:
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

    def _publish(self, sequence: _Sequence, call: _Call, data: bytes, key: str = "") -> bytes:
        """Empty the slot of generation g + 2, and publish the outcome ``data`` (under ``key``).

        One message (``multi_set`` does not wait for an answer), applied in order. Returns the
        outcome published.
        """
        following = (call.generation + 2) % _SLOTS
        keys = [sequence.arrivals[following], sequence.counts[following], key or call.outcome]
        try:
            self._store.multi_set(keys, [b"", b"0", self._seal.seal(keys[2], data)])
        except RuntimeError as exc:
            raise self._failed(exc, "publishing an outcome") from exc
        return data

    def _refuse(
        self, sequence: _Sequence, call: _Call, found: str, what: str, disagree: bool = False
    ) -> bytes:
        """End the call with an error on every rank: the store holds what the job did not write.

        An agreement publishes the error as its outcome. A barrier's outcome is its existence,
        so the error goes to another key, which the others read when their wait runs out.
        """
        failure = _failure(_tampered(what, found, disagree))
        if call.spec != _BARRIER_SPEC:
            return self._publish(sequence, call, failure)
        self._publish(sequence, call, failure, call.refusal)
        _unwrap(decode_json(failure))  # raises
        raise AssertionError("unreachable")  # pragma: no cover

    def _await(self, call: _Call, read: bool, deadline: float, seconds: float, what: str) -> Json:
        """Wait for the outcome of ``call`` (at most until ``deadline``), and read it."""
        # Never zero: torch reads a zero timeout as "wait forever".
        left = timedelta(seconds=max(deadline - time.monotonic(), 0.001))
        # torch waits ``left`` for the key, then reads the server's answer: a live server answers
        # at once, a stopped one never, which the link's limit turns into an error.
        self._link.limit(UNANSWERED_BOUND)
        try:
            if not read:  # a barrier: the outcome's existence is the whole message
                self._store.wait([call.outcome], left)
                return None
            self._store.set_timeout(left)
            data = bytes(self._store.get(call.outcome))
        except RuntimeError as exc:
            if torch_failure(exc) is TorchFailure.STORE_TIMEOUT:
                raise self._timed_out(call, seconds, what) from exc
            raise self._failed(exc, what) from exc
        payload = self._seal.open(call.outcome, data)
        if payload is None:
            raise RemoteError(_tampered(what, "an outcome without this job's seal"))
        return _unwrap(decode_json(payload))

    def _read(self, key: str) -> bytes | None:
        """The value of ``key`` in one round trip, without waiting; None if there is none."""
        data = bytes(self._store.compare_set(key, _NEVER, _NEVER))
        return None if data == _NEVER else data

    def _read_arrivals(self, call: _Call, what: str) -> Records:
        """The records of ``call`` (one round trip, no waiting: this rank's record is there)."""
        try:
            data = self._read(call.arrivals) or b""
        except RuntimeError as exc:
            raise self._failed(exc, what) from exc
        return self._seal.read_records(call.arrivals, data, call.generation, call.members)

    def _timed_out(self, call: _Call, seconds: float, what: str) -> UnidistError:
        """The error for a wait that ran out: it names the ranks that never arrived."""
        refusal = None
        try:
            records = self._read_arrivals(call, what)
            if call.spec == _BARRIER_SPEC:  # did the last rank refuse what the store held?
                try:
                    refusal = self._read(call.refusal)
                except RuntimeError as exc:
                    raise self._failed(exc, what) from exc
        except DistributedTimeoutError as exc:  # the store's host stopped answering
            return exc
        except RemoteError:
            records = Records()
        if refusal is not None and (payload := self._seal.open(call.refusal, refusal)):
            try:
                _unwrap(decode_json(payload))
            except RemoteError as exc:
                return exc
        missing = [rank for rank in call.members if rank not in records.payloads]
        if not missing:
            return DistributedTimeoutError(
                f"{what}: every rank arrived, but the outcome did not come within {seconds:g} "
                "s. HINT: the last rank to arrive died before it published the outcome (look at "
                "the logs of the ranks that stopped), or another process changed the count of "
                "arrivals (see the trust model in unidist's docs)."
            )
        return DistributedTimeoutError(
            f"{what}: rank(s) {missing} did not arrive within {seconds:g} s. HINT: they are "
            "stuck, slow or dead; look at their logs, or raise the timeout if only slow."
        )

    def _failed(self, exc: BaseException, what: str) -> UnidistError:
        """The error for a failed round trip: a store host that stopped answering, or gone."""
        return self._link.unanswered(exc, what) or _store_gone(what, exc)

    def _sequence(self, kind: str, members: tuple[int, ...]) -> _Sequence:
        sequence = self._sequences.get((kind, members))
        if sequence is None:
            packed = struct.pack(f">{len(members)}I", *members)
            base = f"{kind}/{hashlib.blake2b(packed, digest_size=8).hexdigest()}"
            name = self._seal.name
            sequence = self._sequences[(kind, members)] = _Sequence(
                members,
                base,
                counts=tuple(name(f"{base}/count/{slot}") for slot in range(_SLOTS)),
                arrivals=tuple(name(f"{base}/arrivals/{slot}") for slot in range(_SLOTS)),
            )
        return sequence

    def _call(
        self,
        sequence: _Sequence,
        generation: int,
        combine: Combine | None = None,
        expected: ExpectedValues | None = None,
    ) -> _Call:
        slot = generation % _SLOTS
        name = self._seal.name
        spec = b""
        if len(sequence.members) <= _FAST_MAX_MEMBERS:
            spec = _BARRIER_SPEC if sequence.base.startswith("barrier/") else b""
            if expected is not None and combine is not None:
                spec = expected.spec
        shift, bits = _layout(len(sequence.members))
        return _Call(
            generation,
            sequence.members,
            sequence.arrivals[slot],
            sequence.counts[slot],
            name(f"{sequence.base}/outcome/{generation}"),
            name(f"{sequence.base}/refusal/{generation}"),
            spec,
            shift if spec else 0,
            bits if spec else 0,
        )

    # -- flags -------------------------------------------------------------------------------

    def raise_flag(self, name: str) -> None:
        """Set the flag ``name`` (visible to every rank once the store applies it; it never
        waits: the store does not answer a set)."""
        key = self._seal.name(f"flag/{name}")
        self._link.limit(UNANSWERED_BOUND)
        try:
            self._store.set(key, self._seal.seal(key, b"1"))
        except RuntimeError as exc:
            raise self._failed(exc, f"raising the flag {name}") from exc

    def flag_is_raised(self, name: str) -> bool:
        """Whether some rank raised the flag ``name`` (one store round trip; never waits).

        Only a value with the job's seal counts: another process that learnt the key's name
        cannot raise the flag.
        """
        key = self._seal.name(f"flag/{name}")
        self._link.limit(UNANSWERED_BOUND)
        try:
            data = self._read(key)
        except RuntimeError as exc:
            raise self._failed(exc, f"looking at the flag {name}") from exc
        return data is not None and self._seal.open(key, data) == b"1"

    def lower_flag(self, name: str) -> None:
        """Delete the flag ``name`` (call it once no rank can still be looking at it)."""
        self._link.limit(UNANSWERED_BOUND)
        try:
            self._store.delete_key(self._seal.name(f"flag/{name}"))
        except RuntimeError as exc:
            raise self._failed(exc, f"lowering the flag {name}") from exc


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
        "the ranks called it with different expected values (a bug), or another process is "
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
