"""The adapter conformance suite: every clause of the contract, checked over real processes.

Each clause runs on every rank after :func:`unidist.initialize`; it performs the same
collectives on every rank first and checks the results afterwards, so one failing check does not
leave the ranks out of step. :func:`unidist.testing.check_adapter` runs them all in one job.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import unidist
from unidist.environments import variables as _env
from unidist.environments.topology import EnvReading
from unidist.errors import ConfigurationError, RemoteError, UnidistError
from unidist.session import lifecycle

__all__ = ["CLAUSES", "ConformanceError", "check_environment", "run_clauses"]


class ConformanceError(UnidistError, AssertionError):
    """An adapter failed one or more conformance clauses.

    Attributes:
        report: clause name -> {rank: failure message} for the failing clauses.
    """

    def __init__(self, message: str, report: dict[str, dict[int, str]]) -> None:
        super().__init__(message)
        self.report = report


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def _rank_world() -> tuple[int, int]:
    return unidist.get_rank(), unidist.get_world_size()


def check_environment(environment: Any, variables: Mapping[str, str]) -> EnvReading:
    """Check an environment (the other half of an adapter) on one set of its variables.

    No process is started: an environment reads variables only. The checks: it has the
    attributes of :class:`unidist.environments.Environment`; ``detect`` is True for
    ``variables`` and False for an empty environment (otherwise it would claim every single
    process); neither method changes ``variables`` or this process's environment; ``read``
    returns an :class:`~unidist.environments.EnvReading` whose rank is in range, the same twice
    (it depends on ``variables`` only).

    Args:
        environment: an environment object or class (a class is instantiated without arguments).
        variables: what the environment sets in one process of a job.

    Returns:
        What it read.

    Raises:
        ConformanceError: every failed check, under ``report["environment"][0]``.
    """
    if isinstance(environment, type):
        environment = environment()
    name = getattr(environment, "name", repr(environment))
    missing = [
        attribute
        for attribute in ("name", "creates_processes", "detect", "read")
        if not hasattr(environment, attribute)
    ]
    before, given, probe = _env.environ_copy(), dict(variables), dict(variables)
    failures = [f"it has no {', '.join(missing)}"] if missing else []
    reading = None if missing else _read_checked(environment, probe, failures)
    if probe != given:
        failures.append("it changed the variables it was given")
    if _env.environ_copy() != before:
        failures.append("it changed this process's environment (os.environ)")
    if failures or reading is None:
        said = "; ".join(failure.rstrip(". ") for failure in failures)  # each ends once, here
        raise ConformanceError(
            f"environment {name!r} breaks the contract: {said}.",
            {"environment": {0: said}},
        )
    return reading


def _read_checked(
    environment: Any, probe: dict[str, str], failures: list[str]
) -> EnvReading | None:
    """``environment``'s reading of ``probe``, adding what breaks the contract to ``failures``."""
    try:
        if environment.detect(probe) is not True:
            failures.append("detect(variables) is not True for its own variables")
        if environment.detect({}) is not False:
            failures.append("detect({}) is not False: it would claim every single process")
        reading = environment.read(probe)
        again = environment.read(probe)
    except Exception as exc:
        failures.append(f"detect or read raised {type(exc).__name__}: {exc}")
        return None
    if not isinstance(reading, EnvReading):
        failures.append(
            f"read returned {type(reading).__name__}, not an EnvReading (build it with "
            "unidist.environments.reading)"
        )
        return None
    if reading != again:
        failures.append("read gave two different readings of the same variables")
    if not 0 <= reading.rank < reading.world_size:
        failures.append(f"rank {reading.rank} is not in 0..{reading.world_size - 1}")
    return reading


def clause_topology() -> None:
    """Getters match the launcher variables and the adapter's own view of the topology."""
    rank, world = _rank_world()
    topo = unidist.topology()
    launcher = _env.read()  # parsed afresh, not the session's settled copy
    env_rank, env_world = launcher.rank, launcher.world_size
    _expect(
        (rank, world) == (env_rank, env_world),
        f"get_rank/get_world_size = {rank}/{world}, launcher says {env_rank}/{env_world}",
    )
    _expect(
        topo.local_rank == unidist.get_local_rank() and topo.node_rank == 0,
        f"unexpected topology {topo}",
    )
    view = unidist.current_adapter().topology(topo)
    _expect(
        view.rank == rank and view.world_size == world,
        f"adapter.topology() says rank {view.rank} of {view.world_size}",
    )


def clause_all_reduce_tensors() -> None:
    """Every op on integer and float tensors, in place, exact results."""
    import torch

    rank, world = _rank_world()
    ranks = list(range(world))
    got: dict[Any, Any] = {}
    for op in ("sum", "min", "max", "product"):
        got[op, "int"] = unidist.all_reduce(torch.tensor([rank + 1, 10 * (rank + 1)]), op).tolist()
        got[op, "float"] = unidist.all_reduce(torch.tensor([rank + 0.5]), op).tolist()
    mean = torch.tensor([float(rank), 2.0 * rank], dtype=torch.float64)
    same = unidist.all_reduce(mean, "mean")
    got["band"] = unidist.all_reduce(torch.tensor([0b0111 if rank == 0 else 0b1101]), "band").item()
    got["bor"] = unidist.all_reduce(torch.tensor([1 << rank]), "bor").item()
    got["bool"] = unidist.all_reduce(torch.tensor([True, rank == 0]), "band").tolist()
    strided = torch.arange(6.0).reshape(2, 3).t()  # non-contiguous input
    unidist.all_reduce(strided, "sum")
    ints = [r + 1 for r in ranks]
    want: dict[str, Callable[[list[Any]], Any]] = {
        "sum": sum,
        "min": min,
        "max": max,
        "product": _product,
    }
    for op, reduce in want.items():
        _expect(
            got[op, "int"] == [reduce(ints), reduce([10 * i for i in ints])],
            f"all_reduce({op}) on int64 gave {got[op, 'int']}",
        )
        _expect(
            abs(got[op, "float"][0] - reduce([r + 0.5 for r in ranks])) < 1e-6,
            f"all_reduce({op}) on float gave {got[op, 'float']}",
        )
    _expect(same is mean, "all_reduce must return the input tensor (reduced in place)")
    _expect(
        mean.tolist() == [sum(ranks) / world, 2.0 * sum(ranks) / world],
        f"mean gave {mean.tolist()}",
    )
    _expect(got["band"] == (0b0101 if world > 1 else 0b0111), f"band gave {got['band']}")
    _expect(got["bor"] == (1 << world) - 1, f"bor gave {got['bor']}")
    _expect(got["bool"] == [True, world == 1], f"band on bool gave {got['bool']}")
    _expect(
        strided.tolist() == (torch.arange(6.0).reshape(2, 3).t() * world).tolist(),
        "all_reduce on a non-contiguous tensor did not update it in place",
    )


def _product(values: list[Any]) -> Any:
    result = 1
    for value in values:
        result *= value
    return result


def clause_all_reduce_numbers() -> None:
    """Python numbers come back as the same type; big ints stay exact."""
    rank, world = _rank_world()
    total = unidist.all_reduce(rank + 1)
    big = unidist.all_reduce(2**40 + rank, "max")
    flt = unidist.all_reduce(0.25 * (rank + 1))
    mean = unidist.all_reduce(rank, "mean")
    everyone = unidist.all_reduce(True, "band")
    anyone = unidist.all_reduce(rank == 0, "bor")
    _expect(type(total) is int and total == world * (world + 1) // 2, f"sum of ints gave {total!r}")
    _expect(type(big) is int and big == 2**40 + world - 1, f"max of big ints gave {big!r}")
    _expect(
        type(flt) is float and abs(flt - 0.25 * world * (world + 1) / 2) < 1e-12,
        f"sum of floats gave {flt!r}",
    )
    _expect(type(mean) is float and mean == (world - 1) / 2, f"mean gave {mean!r}")
    _expect(everyone is True and anyone is True, f"bool ops gave {everyone!r}, {anyone!r}")


def _expect_rank_order(what: str, firsts: list[Any]) -> None:
    """Each rank gathered its own rank number: the tensors must come back in rank order (a
    set of tensors that is not every rank's once is left to the clause's other checks)."""
    got = [int(value) for value in firsts]
    _expect(
        sorted(got) != list(range(len(got))) or got == sorted(got),
        f"{what} must return the tensors in rank order (index i holds rank i's), but it "
        f"returned the tensors of ranks {got} in that order",
    )


def clause_all_gather() -> None:
    """One tensor per rank in rank order, any shape and dtype, 0-d included."""
    import torch

    rank, world = _rank_world()
    rows = unidist.all_gather(torch.full((2, 3), float(rank)))
    scalars = unidist.all_gather(torch.tensor(rank))
    ints = unidist.all_gather(torch.tensor([rank, -rank], dtype=torch.int64))
    flags = unidist.all_gather(torch.tensor([rank % 2 == 0]))
    _expect(len(rows) == world, f"all_gather returned {len(rows)} tensors for {world} ranks")
    _expect_rank_order("all_gather", [row.flatten()[0] for row in rows if row.numel()])
    for r in range(world):
        _expect(rows[r].shape == (2, 3) and bool((rows[r] == r).all()), f"rows[{r}] = {rows[r]}")
        _expect(scalars[r].dim() == 0 and scalars[r].item() == r, f"scalars[{r}] = {scalars[r]}")
        _expect(ints[r].tolist() == [r, -r] and ints[r].dtype == torch.int64, f"ints[{r}]")
        _expect(flags[r].tolist() == [r % 2 == 0], f"bool gather [{r}] = {flags[r]}")


def clause_all_gather_uneven() -> None:
    """First dimensions may differ per rank, zero included; dtype mismatches are refused."""
    import torch

    rank, world = _rank_world()
    parts = unidist.all_gather_uneven(torch.arange(rank * 3, dtype=torch.float32).reshape(rank, 3))
    try:
        unidist.all_gather_uneven(torch.zeros(2, 3 + rank))
        mismatch = None
    except ConfigurationError as exc:
        mismatch = str(exc)
    _expect(len(parts) == world, f"{len(parts)} parts for {world} ranks")
    for r in range(world):
        _expect(parts[r].shape == (r, 3), f"part {r} has shape {tuple(parts[r].shape)}")
        _expect(parts[r].flatten().tolist() == list(range(r * 3)), f"part {r} = {parts[r]}")
    if world > 1:
        _expect(
            mismatch is not None and "trailing" in mismatch,
            "differing trailing dimensions must raise ConfigurationError on every rank",
        )


def clause_objects() -> None:
    """all_gather_object and broadcast_object keep types; ints stay ints."""
    rank, world = _rank_world()
    gathered = unidist.all_gather_object({"rank": rank, "name": f"r{rank}", "t": (rank, 1.5)})
    sent = unidist.broadcast_object({"big": 2**53 + 1, "x": [1, "a"]} if rank == 0 else None)
    last = unidist.broadcast_object(f"from {world - 1}", src=world - 1)
    number = unidist.broadcast(2**31 + 7 if rank == 0 else -1)
    _expect(
        gathered == [{"rank": r, "name": f"r{r}", "t": (r, 1.5)} for r in range(world)],
        f"all_gather_object gave {gathered}",
    )
    _expect(sent == {"big": 2**53 + 1, "x": [1, "a"]}, f"broadcast_object gave {sent}")
    _expect(last == f"from {world - 1}", f"broadcast_object(src={world - 1}) gave {last!r}")
    _expect(type(number) is int and number == 2**31 + 7, f"broadcast of an int gave {number!r}")


def clause_broadcast_tensors() -> None:
    """Tensors are overwritten in place from any source rank; integers stay exact."""
    import torch

    rank, world = _rank_world()
    results = []
    for src in range(world):
        t = torch.full((3,), float(rank))
        out = unidist.broadcast(t, src=src)
        results.append((out is t, t.tolist()))
    big = unidist.broadcast(torch.tensor([2**40 + 1 if rank == 0 else 0]), src=0).item()
    for src, (same, values) in enumerate(results):
        _expect(same, "broadcast must return the input tensor")
        _expect(values == [float(src)] * 3, f"broadcast from {src} gave {values}")
    _expect(big == 2**40 + 1, f"int64 broadcast of 2**40 + 1 gave {big}")


def clause_barrier() -> None:
    """Barriers return on every rank, with and without a timeout."""
    unidist.barrier()
    unidist.barrier(timeout=30)


def clause_groups() -> None:
    """Collectives on a subgroup are sized by it; non-members skip it."""
    import torch

    rank, world = _rank_world()
    members = list(range(0, world, 2)) if world > 1 else [0]
    group = unidist.new_group(members)
    if rank in group:
        total = unidist.all_reduce(torch.tensor([rank + 1]), group=group).item()
        gathered = unidist.all_gather(torch.tensor([rank]), group=group)
        objects = unidist.all_gather_object(rank, group=group)
        sent = unidist.broadcast_object(
            "hello" if rank == members[-1] else None, src=members[-1], group=group
        )
        unidist.barrier(group=group)
        unidist.barrier(timeout=30, group=group)
        _expect(total == sum(m + 1 for m in members), f"group all_reduce gave {total}")
        _expect([g.item() for g in gathered] == members, f"group all_gather gave {gathered}")
        _expect(objects == members, f"group all_gather_object gave {objects}")
        _expect(sent == "hello", f"group broadcast_object gave {sent!r}")
        _expect(unidist.get_world_size(group) == len(members), "get_world_size(group)")
        _expect(unidist.get_rank(group) == members.index(rank), "get_rank(group)")
    unidist.barrier()


def clause_one_rank_first() -> None:
    """The first rank finishes the block before the others start; its failure reaches them."""
    rank, world = _rank_world()
    shared = Path(str(unidist.broadcast_object(tempfile.mkdtemp() if rank == 0 else None)))
    marker = shared / "first-done"
    seen_before = None
    with unidist.one_rank_first():
        if rank != 0:
            seen_before = marker.exists()
        else:
            marker.write_text("done")
    outcome = None
    try:
        with unidist.one_rank_first(rank=world - 1, timeout=30):
            if rank == world - 1:
                raise ValueError("planned failure on the first rank")
    except ValueError:
        outcome = "raised itself"
    except RemoteError as exc:
        outcome = "remote" if "planned failure" in str(exc) else f"wrong message: {exc}"
    unidist.barrier()
    if rank != 0:
        _expect(seen_before is True, "a waiting rank ran the block before rank 0 finished it")
    expected = "raised itself" if rank == world - 1 else "remote"
    _expect(outcome == expected, f"one_rank_first failure: rank {rank} got {outcome!r}")


def clause_one_rank_only() -> None:
    """rank_zero_only and one_rank_only run on one rank; the others get None."""
    rank, world = _rank_world()

    @unidist.rank_zero_only
    def zero() -> int:
        return 7

    @unidist.one_rank_only(rank=world - 1, barrier=True)
    def last() -> str:
        return "ran"

    got = (zero(), last())
    _expect(
        got == ((7 if rank == 0 else None), ("ran" if rank == world - 1 else None)),
        f"rank {rank} got {got}",
    )


def clause_primitives() -> None:
    """The adapter's own primitives follow the contract (shapes, order, return values)."""
    import torch

    rank, world = _rank_world()
    adapter = lifecycle.session_for("conformance").adapter
    if world == 1:
        return
    reduced = adapter.all_reduce(torch.tensor([rank + 1.0]), "sum", None)
    gathered = adapter.all_gather(torch.tensor([[rank]]), None)
    sent = adapter.broadcast(torch.tensor([rank]), 0, None)
    adapter.barrier(None)
    _expect(reduced.tolist() == [world * (world + 1) / 2], f"primitive all_reduce: {reduced}")
    _expect(
        len(gathered) == world,
        f"primitive all_gather returned {len(gathered)} tensors for {world} ranks",
    )
    shapes = [tuple(g.shape) for g in gathered]
    _expect(
        all(shape == (1, 1) for shape in shapes),
        f"primitive all_gather must return one tensor shaped like the input (1, 1) per rank, "
        f"got shapes {shapes}",
    )
    _expect_rank_order("primitive all_gather", [g.flatten()[0] for g in gathered])
    _expect(sent.tolist() == [0], f"primitive broadcast: {sent}")


def clause_environment() -> None:
    """The adapter's environment (where its jobs run) keeps the environment contract and, where
    it finds this job's variables, reads this rank's place as the session does."""
    from unidist.environments.places import BUILT_IN, SingleProcess

    session = lifecycle.session_for("conformance")
    _expect(
        hasattr(session.adapter, "environment"),
        f"the adapter {session.adapter.name!r} has no `environment`",
    )
    place: Any = session.adapter.environment
    if place is None or isinstance(place, SingleProcess):  # SingleProcess claims any process
        return
    variables = _env.environ_copy()
    if not place.detect(variables):  # it runs elsewhere: its own contract only
        _expect(
            isinstance(place, BUILT_IN) or place.detect({}) is False,
            f"environment {place.name!r}: detect({{}}) must be False",
        )
        return
    reading = check_environment(place, variables)
    topo = session.topology
    _expect(
        (reading.rank, reading.world_size) == (topo.rank, topo.world_size),
        f"environment {place.name!r} reads rank {reading.rank} of {reading.world_size}; the "
        f"session is rank {topo.rank} of {topo.world_size}",
    )


def clause_communicator() -> None:
    """The session's communicator agrees, exchanges and passes flags the same on every rank."""
    from unidist.collectives import sync

    rank, world = _rank_world()
    comm = lifecycle.session_for("conformance").comm

    def odd_ones(votes: dict[int, Any]) -> Any:
        return sorted([r, v["odd"]] for r, v in votes.items())

    tally = sync.agree({"rank": rank, "odd": rank % 2 == 1}, odd_ones, 30, "conformance vote")
    _expect(
        tally == [[r, r % 2 == 1] for r in range(world)],
        f"{comm.kind} communicator: rank {rank} got the tally {tally}",
    )
    last = world - 1
    heard = sync.exchange(
        ["from", rank] if rank == last else None,
        publish=rank == last,
        wait_for=[last],
        timeout=30,
        what="conformance exchange",
    )
    _expect(heard == {last: ["from", last]}, f"rank {rank} heard {heard}")
    flag = sync.Flag(lifecycle.session_for("conformance"), "conformance", "flag")
    if rank == last:
        flag.raise_flag()
    unidist.barrier(timeout=30)
    raised = flag.is_raised()
    unidist.barrier(timeout=30)
    if rank == 0:
        flag.lower()
    _expect(  # an unusable flag (nobody else can see it) is never raised
        raised == flag.usable,
        f"rank {rank}: a flag that rank {last} raised reads {raised} (usable: {flag.usable})",
    )


CLAUSES: dict[str, Callable[[], None]] = {
    "topology": clause_topology,
    "environment": clause_environment,
    "primitives": clause_primitives,
    "all_reduce_tensors": clause_all_reduce_tensors,
    "all_reduce_numbers": clause_all_reduce_numbers,
    "all_gather": clause_all_gather,
    "all_gather_uneven": clause_all_gather_uneven,
    "objects": clause_objects,
    "broadcast_tensors": clause_broadcast_tensors,
    "barrier": clause_barrier,
    "groups": clause_groups,
    "one_rank_first": clause_one_rank_first,
    "one_rank_only": clause_one_rank_only,
    "communicator": clause_communicator,
}


def run_clauses(names: list[str]) -> dict[str, str | None]:
    """Run the named clauses on this rank; returns clause -> None (passed) or the failure."""
    report: dict[str, str | None] = {}
    for name in names:
        try:
            CLAUSES[name]()
            report[name] = None
        except Exception as exc:
            report[name] = f"{type(exc).__name__}: {exc}"
    return report
