"""Tell every node's launcher which rank failed, through the rendezvous store they already share.

Without it, a rank that fails on one node is seen only by that node's launcher: the ranks of the
other nodes wait until their own timeout (a ``barrier(timeout=60)``, or the process group's
timeout in a collective) and their launcher then blames one of its own ranks. With it:

* a launcher that sees one of its ranks fail publishes the culprit (rank, node, host, what it
  raised or how it exited, when) under one key of the rendezvous store, first writer wins
  (``compare_set``); a rank's own failure replaces a published wait (a timeout or a collective
  broken by a peer), never the other way round;
* every launcher looks for that key every ``POLL`` seconds (one ``check``, O(1) per launcher
  whatever the number of nodes, each round trip with a deadline of ``DEADLINE`` seconds); on
  seeing it, it stops its own ranks as after a local failure and reports the same culprit;
* each launcher that has seen the record says so (one ``add``); a launcher leaving after a
  failure waits, up to ``LINGER`` seconds, until every node has, because the store lives in one of
  the launchers (node 0's for the static rendezvous, the endpoint host's for c10d) and goes with
  it;
* a node whose launcher dies with its ranks (a host that goes down, a launcher killed by SIGKILL)
  reports nothing, and a rank of another node waiting for one of its ranks through the store
  (``unidist.barrier(timeout=...)``, a checkpoint's barrier) would wait out its whole timeout,
  minutes. So each launcher also beats (one ``add`` per poll) and watches one other node's beat,
  the next node's that has not left (O(1) per launcher): a beat that stood still for the
  rendezvous keep-alive (``LOST_AFTER`` seconds unless torch's c10d settings say otherwise) of the
  watcher's own polling makes the watcher publish that node as the culprit, kind ``lost``, and
  every node stops its ranks as for any other failure (a node not yet seen beating in the round
  gets twice as long). A launcher that leaves on its own, or moves on to the next round, says
  so first, so that it is never taken for lost;
* a launcher whose ranks all finished leaves the round at once (:meth:`Relay.leave`: its beat
  says "left", one ``add`` counts it among the nodes a lingering launcher need not wait for) and
  makes no further round trip in it. The store's host leaves only after torch's exit barrier,
  which every node's agent reaches after its ranks exit, and the last rank of a node to finish
  exits only once its launcher has left the round (``UNIDIST_AWAIT_LEAVE``,
  :func:`unidist.launch.rank.runtime.record_done`): so no round trip meets a vanishing store, which
  torch's client would answer with a C++ warning and its stack on the launcher's stderr. Such a
  node no longer learns of a failure elsewhere: its own ranks' outcome is what it reports.

* for hang attribution, each launcher adds its ranks' progress to one counter (one ``add`` per
  poll, O(1) per launcher), so a node whose ranks wait while another node's work knows the job
  is not silent; the first launcher to call a hang raises a flag (``compare_set``), the others
  call it at their next poll, and each publishes its ranks' facts under a key of its own and
  reads every node's (O(nodes), once per hang), so every node prints the same report; a node
  whose facts do not come within :data:`GATHER` seconds is named as not answering.

The store is torch's: the static rendezvous's ``TCPStore`` on ``--master-addr`` or the c10d
rendezvous's at ``--rdzv-endpoint`` (other backends: no relay). The relay opens a client of its
own there, so its short deadlines never touch the agent's connection. Keys are scoped by the run
id and the rendezvous round (the restart count and the round's ``MASTER_ADDR:MASTER_PORT``), so
a failure that a restart recovered from never stops the next round. The record is plain JSON,
size-limited and checked for shape and consistency (the rank belongs to the node that reports
it, the text is printable) before it is believed; nothing is unpickled. The launchers share no
secret, so the record is not sealed: anyone who can write to the rendezvous store can stop the
job and name a wrong culprit, as they can already disturb the rendezvous itself (see
``docs/trust-model.md``); a culprit learned this way is always reported as relayed from the
other node's launcher.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from unidist.hangs.verdict import RankFacts
from unidist.launch.supervise import notices
from unidist.launch.supervise.events import Culprit, Event, HangFlag
from unidist.session.link import Link, connect_within

__all__ = ["DEADLINE", "LINGER", "LOST_AFTER", "POLL", "Relay"]

#: Seconds between two looks at the store.
POLL = 0.5
#: Seconds one store round trip (or the connection) may take.
DEADLINE = 2.0
#: Seconds a failed launcher waits for the others to have seen the culprit before it leaves.
LINGER = 5.0
#: Seconds a node's beat may stand still before the node watching it publishes it as lost, unless
#: told otherwise: torch's c10d rendezvous keep-alive (``keep_alive_interval`` x
#: ``keep_alive_max_attempt``, 5 s x 3 by default), generous: a loaded launcher still beats.
LOST_AFTER = 15.0
#: What a launcher adds to its beat when it leaves the round: the count says "left", not "lost".
_LEFT = 1 << 40
#: Seconds a launcher that called a hang waits for every node's facts.
GATHER = 5.0
#: Polls that try to read a raised hang flag before the hang is called without its value.
FLAG_READS = 3


class _Watch:
    """One launcher's view of the node it watches: which node, and since when its beat stood."""

    def __init__(self, me: int, nodes: int, now: float) -> None:
        self._nodes = nodes
        self.node = (me + 1) % nodes
        self._count: int | None = None
        self._since = now  # when the count last moved (or watching began)
        self._looked = now

    def skip(self) -> None:
        """The watched node left: follow the next one (this launcher's own node ends it)."""
        self.node = (self.node + 1) % self._nodes
        self._count = None

    def silent(self, count: int, now: float) -> float:
        """Seconds the beat has stood still, given that it reads ``count`` now.

        Counted on this launcher's own clock, and only across looks that came on time: a
        watcher that was itself held up (a stopped process, a swapping host) starts counting
        again instead of blaming the other node for its own absence.
        """
        late = now - self._looked > POLL + 2 * DEADLINE
        self._looked = now
        if count != self._count or late:
            self._count, self._since = count, now
        if count == 0:  # no beat yet in this round: it may have begun the round after this one
            return (now - self._since) / 2
        return now - self._since


class Relay(threading.Thread):
    """Publishes this node's culprit and watches for another node's, on the rendezvous store.

    The supervisor calls :meth:`round` when a new start of this node's ranks begins and
    :meth:`publish` when one of them fails; what this thread learns (the job's culprit, a hang
    called elsewhere) it posts to ``notify`` (the supervisor's inbox) as a
    :class:`~unidist.launch.supervise.events.Culprit` or
    :class:`~unidist.launch.supervise.events.HangFlag`. Every store round trip happens in this
    thread, so a slow or vanished store never delays the supervisor.
    """

    def __init__(
        self,
        host: str,
        port: int,
        run_id: str,
        lost: float = LOST_AFTER,
        notify: Callable[[Event], None] | None = None,
    ) -> None:
        super().__init__(name="unidist-launch-relay", daemon=True)
        self.lost = lost  # seconds of a still beat that make a node lost
        self.notify = notify  # set before start()
        self._address = (host, port)
        self._prefix = f"unidist/launch/{run_id}"
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._store: Any = None
        self._link: Link | None = None  # keeps the deadline of the connection
        self._round: tuple[str, int, int] | None = None  # (generation, world size, nproc)
        self._pending: notices.Failure | None = None
        self._published = threading.Event()
        self._received: tuple[str, notices.Failure] | None = None
        self._acked: str | None = None
        self._node = 0  # this launcher's node rank in the round
        self._beating: tuple[str, int] | None = None  # (round, node) of this launcher's beat
        self._watch: _Watch | None = None  # the other node's beat this launcher follows
        self._leave: tuple[str, Callable[[], None]] | None = None  # asked: (round, then)
        self._left: str | None = None  # the round this launcher left (its ranks all finished)
        self.errors = 0  # failed round trips, for the curious
        self._progress = (0, 0)  # (this node's count, what was added to the store of it)
        self._total = 0  # the job's progress count, as the store last said
        self._hang_elsewhere = False  # another node called a hang in this round
        self._hang_out: str | None = None  # this node's facts, to publish
        self._hang_in: dict[int, list[RankFacts]] = {}
        self._hang_done = threading.Event()
        self._flag_reads = 0  # reads of a raised hang flag that failed in a row

    # -- the supervisor's side -----------------------------------------------------------------

    def round(self, generation: str, world_size: int, nproc: int, node_rank: int = 0) -> None:
        """Follow the rendezvous round ``generation`` from now on (forgetting the last one's);
        this launcher is node ``node_rank`` of it."""
        with self._lock:
            if self._round is not None and self._round[0] == generation:
                return
            self._round = (generation, world_size, nproc)
            self._node = node_rank
            self._pending, self._received, self._acked = None, None, None
            self._published.clear()
            self._progress, self._total, self._hang_elsewhere = (0, 0), 0, False
            self._hang_out, self._hang_in = None, {}
            self._hang_done.clear()
        self._wake.set()

    def publish(self, failure: notices.Failure) -> None:
        """Tell the other nodes (soon, from this thread) that ``failure`` happened here."""
        with self._lock:
            if self._pending is None or (failure.own and not self._pending.own):
                self._pending = failure
                self._published.clear()
        self._wake.set()

    def leave(self, then: Callable[[], None]) -> None:
        """This node's ranks of the current round all finished: say so on the store (soon,
        from this thread), make no further round trip in the round, then call ``then`` (also
        when the store could not be told, and at once when no round is followed)."""
        asked = False
        with self._lock:
            if self._round is not None and self._left != self._round[0]:
                self._leave, asked = (self._round[0], then), True
        if not asked:
            then()
            return
        self._wake.set()

    def progress(self, count: int) -> int:
        """This node's progress count is ``count``; returns the job's, as last seen (0: none)."""
        with self._lock:
            self._progress = (count, self._progress[1])
            return self._total

    def hang_facts(self, facts: list[RankFacts]) -> tuple[list[RankFacts], list[int]]:
        """Share this node's ``facts`` and gather those of every node of the round (at most
        :data:`GATHER` s): (every rank's facts, the nodes that did not answer)."""
        with self._lock:
            current = self._round
            node = self._node
        if current is None:
            return facts, []
        nodes = max(1, current[1] // current[2])
        payload = json.dumps([f.to_json() for f in facts])[: notices.MAX_FACTS]
        with self._lock:
            self._hang_out = payload
            self._hang_in = {node: facts}
            self._hang_done.clear()
        self._wake.set()
        self._hang_done.wait(timeout=GATHER + 2 * DEADLINE)
        with self._lock:
            gathered = dict(self._hang_in)
        missing = [n for n in range(nodes) if n not in gathered]
        for n in missing:  # its launcher did not answer: its ranks are as silent as it is
            gathered[n] = [
                RankFacts(rank, n, f"node {n}", "silent")
                for rank in range(n * current[2], (n + 1) * current[2])
            ]
        every = [fact for n in sorted(gathered) for fact in gathered[n]]
        return every, missing

    def received(self) -> notices.Failure | None:
        """The job's culprit as the store says, once known (this round only)."""
        with self._lock:
            return self._received[1] if self._received is not None else None

    def stop(self) -> None:
        """End the thread (its store connection with it)."""
        self._halt.set()
        self._wake.set()
        self.join(timeout=2 * DEADLINE + 1)

    def linger(self) -> bool:
        """Before a failed launcher leaves: publish what is pending, wait for every node to see it.

        Bounded by :data:`LINGER`; returns at once when no failure is known for this round.

        Returns:
            False when it gave up at its deadline (or was stopped) before every node had seen
            the failure; True otherwise.
        """
        deadline = time.monotonic() + LINGER
        # The supervisor may not have published this node's failure yet (it looks every 50 ms).
        while time.monotonic() < deadline - LINGER + 0.5 and not self._known():
            time.sleep(0.05)
        with self._lock:
            pending = self._pending is not None
        if pending:
            self._published.wait(timeout=max(0.0, deadline - time.monotonic()))
        while time.monotonic() < deadline and not self._halt.is_set():
            with self._lock:
                known, current = self._received is not None, self._round
            if not known or current is None:
                return True
            seen = self._add(self._key(current[0], "seen"), 0)  # or left the round
            if seen is None or seen >= current[1] // current[2]:
                return seen is not None
            time.sleep(0.1)
        return False

    def _known(self) -> bool:
        with self._lock:
            return self._pending is not None or self._received is not None

    # -- this thread ---------------------------------------------------------------------------

    def run(self) -> None:
        while not self._halt.is_set():
            self._wake.wait(timeout=POLL)
            self._wake.clear()
            if self._halt.is_set():
                break
            with self._lock:
                current, pending, leave = self._round, self._pending, self._leave
                settled = self._received is not None and self._received[1].own
            if current is None:
                continue
            try:
                self._poll(current, pending, leave, settled)
            except Exception:  # what another writer of the store put there: never the end
                self.errors += 1  # of this thread (its beats would stop: "node lost")
        with self._lock:
            current, leave = self._round, self._leave
        if current is not None and leave is not None:
            self._depart(current, *leave)
        if self._beating is not None:  # leaving: not to be taken for lost
            self._add(self._key(self._beating[0], f"beat/{self._beating[1]}"), _LEFT)
        self._store = None

    def _poll(
        self,
        current: tuple[str, int, int],
        pending: notices.Failure | None,
        leave: tuple[str, Callable[[], None]] | None,
        settled: bool,
    ) -> None:
        """One look at the store in round ``current``."""
        if leave is not None:
            self._depart(current, *leave)
        if self._left == current[0]:
            if pending is not None:  # a rank failed after all had finished: still told
                self._send(current, pending)
            return
        self._beat(current)
        self._sync_progress(current)
        self._hang_step(current)
        if pending is not None:
            self._send(current, pending)
        elif not settled:
            self._look(current)
            self._follow(current)

    def _key(self, generation: str, name: str) -> str:
        return f"{self._prefix}/{generation}/{name}"

    def _connect(self) -> Any:
        if self._store is None:
            host, port = self._address
            # A plain connection first: torch's client retries a refused or silent address
            # until its timeout, logging an error for each try, and cannot be interrupted at
            # exit; the store is often gone at the end of a job (its host's launcher left).
            with socket.create_connection((host, port), timeout=DEADLINE):
                pass
            # torch's client bounds only its waits; the link bounds every round trip, so a
            # stopped launcher that hosts the store costs DEADLINE, not a hang.
            link = connect_within(
                host, port, timedelta(seconds=DEADLINE), f"the rendezvous store at {host}:{port}"
            )
            link.limit(DEADLINE)
            self._link, self._store = link, link.store
        return self._store

    def _call(self, operation: Any) -> Any:
        """One round trip with the store (deadline :data:`DEADLINE`), or None if it failed."""
        try:
            store = self._connect()
            if self._link is not None and self._link.closed_by_peer():
                # The store's launcher left (the end of a job: the others finish a moment
                # later). Asked, torch's client would log a C++ warning and its stack first.
                raise ConnectionError("the store closed the connection")
            return operation(store)
        except Exception:  # a store that is gone, slow or refusing: try again next time
            self.errors += 1
            self._store = None
            if self._link is not None:
                self._link.close()
                self._link = None
            return None

    def _beat(self, current: tuple[str, int, int]) -> None:
        """One beat of this launcher in round ``current`` (having left the round before)."""
        with self._lock:
            node = self._node
        if self._beating != (current[0], node):
            if self._beating is not None:  # under the node rank it had in that round
                self._add(self._key(self._beating[0], f"beat/{self._beating[1]}"), _LEFT)
            self._beating, self._watch = (current[0], node), None
        self._add(self._key(current[0], f"beat/{node}"), 1)

    def _depart(
        self, current: tuple[str, int, int], generation: str, then: Callable[[], None]
    ) -> None:
        """Leave round ``generation``: this node's beat says "left", and unless this node has
        acknowledged a culprit, it counts (under "seen") among the nodes a lingering launcher
        does not await."""
        with self._lock:
            if self._leave is not None and self._leave[0] == generation:
                self._leave = None
            acked = self._acked == generation
        try:
            if generation != current[0]:
                return  # a new round began meanwhile: the old one was left on the way
            with self._lock:
                node, self._left = self._node, generation
            old, self._beating = self._beating, None
            if old is not None and old[0] != generation:  # never beat in this round yet
                self._add(self._key(old[0], f"beat/{old[1]}"), _LEFT)
            self._add(self._key(generation, f"beat/{node}"), _LEFT)
            if not acked:  # counted once: a node that left never acknowledges afterwards
                self._add(self._key(generation, "seen"), 1)
        finally:
            then()

    def _follow(self, current: tuple[str, int, int]) -> None:
        """Read the watched node's beat; publish that node as lost if it stood still too long."""
        nodes = current[1] // current[2]
        assert self._beating is not None  # _beat came first
        me = self._beating[1]
        if self._watch is None:
            self._watch = _Watch(me, nodes, time.monotonic())
        node = self._watch.node
        if node == me:
            return  # every other node left (or there is none)
        count = self._add(self._key(current[0], f"beat/{node}"), 0)
        if count is None:
            return  # no answer: nothing learnt either way
        if count >= _LEFT:
            self._watch.skip()  # it left: watch the next one
            return
        silent = self._watch.silent(count, time.monotonic())
        if silent >= self.lost:
            self.publish(notices.lost(node, current[2], silent, me))

    def _sync_progress(self, current: tuple[str, int, int]) -> None:
        """Add what this node progressed since the last poll; read the job's total."""
        with self._lock:
            count, sent = self._progress
        total = self._add(self._key(current[0], "progress"), max(0, count - sent))
        if total is None:
            return
        with self._lock:
            if self._round == current:
                self._progress = (self._progress[0], max(sent, count))
                self._total = total

    def _hang_step(self, current: tuple[str, int, int]) -> None:
        """Learn of a hang called elsewhere; publish this node's facts and gather the others'."""
        flag = self._key(current[0], "hang")
        with self._lock:
            payload, node, elsewhere = self._hang_out, self._node, self._hang_elsewhere
        if payload is None:
            if not elsewhere and self._call(lambda store: store.check([flag])):
                raw = self._call(lambda store: store.get(flag))
                self._flag_reads = 0 if raw is not None else self._flag_reads + 1
                if raw is None and self._flag_reads < FLAG_READS:
                    return  # the store did not hand it over: read it again at the next poll
                with self._lock:
                    self._hang_elsewhere = self._round == current
                    told = self._hang_elsewhere
                if told:
                    named = notices.flag_node(raw, current) if raw is not None else None
                    self._tell(HangFlag(current[0], named, read=raw is not None))
            return
        self._call(lambda store: store.compare_set(flag, "", str(node)))
        self._call(lambda store: store.set(self._key(current[0], f"hang/{node}"), payload))
        deadline = time.monotonic() + GATHER
        nodes = max(1, current[1] // current[2])
        while time.monotonic() < deadline and not self._halt.is_set():
            with self._lock:
                have = set(self._hang_in)
            for other in range(nodes):
                if other in have:
                    continue
                key = self._key(current[0], f"hang/{other}")
                if self._call(lambda store, key=key: store.check([key])):
                    raw = self._call(lambda store, key=key: store.get(key))
                    facts = notices.facts(raw, other, current) if raw is not None else None
                    if facts is not None:
                        with self._lock:
                            self._hang_in[other] = facts
            with self._lock:
                if len(self._hang_in) >= nodes:
                    break
            time.sleep(POLL / 5)
        with self._lock:
            self._hang_out = None
        self._hang_done.set()

    def _send(self, current: tuple[str, int, int], failure: notices.Failure) -> None:
        key, value = self._key(current[0], "failed"), notices.encode(failure)
        stored = self._call(lambda store: store.compare_set(key, "", value))
        if stored is None:
            return
        found = notices.decode(stored, current[1], current[2])
        if found is None or (failure.own and not found.own):
            # A wait was published first, and a rank's own failure explains it; or the key holds
            # what no launcher of this job writes: replace it (only if unchanged meanwhile).
            replaced = self._call(lambda store: store.compare_set(key, stored, value))
            if replaced is None:
                return
            found = notices.decode(replaced, current[1], current[2])
        with self._lock:
            if self._pending is failure:
                self._pending = None
                self._published.set()
        self._take(current, found)

    def _look(self, current: tuple[str, int, int]) -> None:
        key = self._key(current[0], "failed")
        if not self._call(lambda store: store.check([key])):
            return
        raw = self._call(lambda store: store.get(key))
        if raw is not None:
            self._take(current, notices.decode(raw, current[1], current[2]))

    def _take(self, current: tuple[str, int, int], found: notices.Failure | None) -> None:
        if found is None:
            return  # not a record this job's launchers write: ignored, never believed
        with self._lock:
            if self._round != current:
                return
            new = self._received != (current[0], found)
            self._received = (current[0], found)
            ack = self._acked != current[0] and self._left != current[0]  # left: counted so
            self._acked = current[0]
        if new:
            self._tell(Culprit(current[0], found))
        if ack:
            self._add(self._key(current[0], "seen"), 1)

    def _tell(self, event: Event) -> None:
        if self.notify is not None:
            self.notify(event)

    def _add(self, key: str, amount: int) -> int | None:
        result: int | None = self._call(lambda store: store.add(key, amount))
        return result
