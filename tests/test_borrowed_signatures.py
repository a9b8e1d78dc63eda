"""Every argument of a Composer or Ignite function that unidist mirrors keeps its meaning or fails.

The signatures are read from the installed packages (``inspect.signature``), so a keyword added
upstream fails here until it has a verdict: accepted with the same meaning and default, or
refused with an error that names unidist's spelling. Positions too: each positional parameter
of theirs is unidist's at the same position (same name, or a listed rename with the same
meaning), or passing it there fails at once with a listed error. A function of theirs that
unidist has under the same name must be in the tables below, so a new one cannot slip through.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

import unidist
from unidist._base.migration import POINTERS
from unidist.parallel.models import ddp_keywords


@dataclass(frozen=True)
class Same:
    """Accepted by unidist's function under the same name, with the same default."""


@dataclass(frozen=True)
class Equivalent:
    """Accepted under the same name; the defaults are spelt differently but mean the same."""

    why: str


@dataclass(frozen=True)
class Refused:
    """unidist's function refuses the keyword with an error containing ``fragment``."""

    fragment: str
    value: Any = 1


@dataclass(frozen=True)
class OnlyGroups:
    """Accepted, but only unidist's ``Group``; their list of ranks or process group is refused."""


@dataclass(frozen=True)
class Forwarded:
    """Their ``**kwargs``: each keyword of ``target`` (as they pass them on) gets a verdict.

    ``verdict(name)`` says what unidist does with it; ``ours_takes`` whether unidist's
    function passes such keywords on (it has ``**kwargs`` or the name itself).
    """

    target: Callable[[], set[str]]
    verdict: Callable[[str], Any]


Verdict = Same | Equivalent | Refused | OnlyGroups | Forwarded
SAME = Same()
GROUP = OnlyGroups()
TENSOR = Refused("pass the tensor (or number) first, positionally")


def _parameters(fn: Callable[..., Any], *skip: str) -> set[str]:
    """The public keywords of ``fn`` (torch's private ``_name`` ones are no user's keywords)."""
    kinds = inspect.signature(fn).parameters
    return {
        name
        for name, parameter in kinds.items()
        if name not in {"self", *skip}
        and not name.startswith("_")
        and parameter.kind is not inspect.Parameter.VAR_KEYWORD
    }


def _init_process_group() -> set[str]:
    return _parameters(torch.distributed.init_process_group, "backend", "timeout")


def _new_group() -> set[str]:
    return _parameters(torch.distributed.new_group, "ranks")


def _dataloader() -> set[str]:
    return _parameters(torch.utils.data.DataLoader.__init__, "dataset")


def _ddp() -> set[str]:
    return _parameters(torch.nn.parallel.DistributedDataParallel.__init__, "module")


def _loader_verdict(name: str) -> Verdict:
    if name == "batch_size":
        return Refused("pass global_batch_size=", 8)
    # A keyword of DataLoader (batch_sampler too, used as given, as Ignite does): auto_dataloader
    # passes it on (or takes it itself).
    return SAME


def _ddp_verdict(name: str) -> Verdict:
    if name == "device_ids":  # Ignite refuses it too (with CUDA): both set it themselves
        return Refused("unidist sets DDP's device_ids", [0])
    return SAME


FROM_ENV = Refused("from the launcher's environment")

COMPOSER: dict[str, dict[str, Verdict]] = {
    "is_initialized": {},
    "get_world_size": {},
    "get_local_rank": {},
    "get_local_world_size": {},
    "get_node_rank": {},
    "barrier": {"group": GROUP},
    "all_reduce": {"tensor": TENSOR, "reduce_operation": Refused("use op="), "group": GROUP},
    "broadcast": {
        "tensor": TENSOR,
        "src": Equivalent("Composer requires src; unidist defaults to rank 0"),
        "group": GROUP,
    },
    "all_gather": {"tensor": SAME, "group": GROUP},
    "all_gather_object": {"obj": SAME, "group": GROUP},
    "get_sampler": {
        "dataset": SAME,
        "drop_last": SAME,
        "shuffle": Equivalent("None means False unless sampler= is given (a unidist keyword)"),
        "num_replicas": SAME,
        "rank": SAME,
        "seed": SAME,
    },
}

IGNITE: dict[str, dict[str, Verdict]] = {
    "initialize": {
        "backend": Equivalent("Ignite requires it; unidist's None picks one by device"),
        "kwargs": Forwarded(_init_process_group, lambda name: FROM_ENV),
    },
    "finalize": {},
    "backend": {},
    "available_backends": {},
    "device": {},
    "get_rank": {},
    "get_world_size": {},
    "get_local_rank": {},
    "get_node_rank": {},
    "show_config": {},
    "all_reduce": {
        "tensor": TENSOR,
        "op": Equivalent("'SUM' and 'sum' are one op: unidist reads any case"),
        "group": GROUP,
    },
    "all_gather": {"tensor": SAME, "group": GROUP},
    "broadcast": {"tensor": TENSOR, "src": SAME, "safe_mode": Refused("unidist.broadcast_object")},
    "barrier": {},
    "new_group": {
        "ranks": SAME,
        "kwargs": Forwarded(_new_group, lambda name: Refused("session's backend and timeout")),
    },
    "one_rank_only": {"rank": SAME, "with_barrier": Refused("use barrier=")},
    "one_rank_first": {"rank": SAME, "local": SAME},
    "auto_dataloader": {"dataset": SAME, "kwargs": Forwarded(_dataloader, _loader_verdict)},
    "auto_model": {
        "model": SAME,
        "sync_bn": Refused("use sync_batchnorm=True", True),
        "kwargs": Forwarded(_ddp, _ddp_verdict),
    },
    "auto_optim": {
        "optimizer": SAME,
        # Ignite passes them to Horovod's DistributedOptimizer; so does unidist with via="ignite".
        "kwargs": Forwarded(lambda: {"backward_passes_per_step"}, lambda name: SAME),
    },
    # unidist.spawn(fn, *args, nproc=N) has another call shape; Ignite's keywords fail at once,
    # naming unidist's spelling (tests/test_borrowed_ignite.py checks each message).
    "spawn": {
        "backend": Equivalent("a keyword of unidist.spawn too (Ignite's first positional)"),
        "fn": SAME,
        "args": Refused("spawn(fn, *args, nproc=N)"),
        "kwargs_dict": Refused("functools.partial"),
        "nproc_per_node": Refused("use nproc=N"),
        "kwargs": Forwarded(
            lambda: {"nnodes", "node_rank", "master_addr", "master_port", "init_method"},
            lambda name: Refused("unidist launch"),
        ),
    },
}


def _call_with(name: str, keyword: str, value: Any) -> None:
    """Call unidist's ``name`` with one foreign keyword and minimal other arguments."""
    fn = getattr(unidist, name)
    model = nn.Linear(2, 2)
    leading: dict[str, tuple[Any, ...]] = {
        "all_reduce": (torch.ones(1),),
        "broadcast": (torch.ones(1),),
        "all_gather": (torch.ones(1),),
        "all_gather_object": (1,),
        "new_group": ([0],),
        "get_sampler": (range(4),),
        "auto_dataloader": (range(4),),
        "auto_model": (model,),
        "auto_optim": (torch.optim.SGD(model.parameters(), lr=0.1),),
        "spawn": (print,),
    }
    kwargs = {keyword: value}
    if name == "auto_model":
        kwargs["device"] = "cpu"
    fn(*leading.get(name, ()), **kwargs)


def _check(name: str, keyword: str, verdict: Verdict, theirs: inspect.Signature) -> None:
    ours = inspect.signature(getattr(unidist, name)).parameters
    forwards = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ours.values())
    if isinstance(verdict, Same | Equivalent | OnlyGroups):
        assert keyword in ours or forwards, f"unidist.{name} does not take {keyword}="
        if isinstance(verdict, Same) and keyword in ours and keyword in theirs.parameters:
            default = theirs.parameters[keyword].default
            assert ours[keyword].default == default, (
                f"unidist.{name}({keyword}=) defaults to {ours[keyword].default!r}, theirs to "
                f"{default!r}"
            )
        if isinstance(verdict, OnlyGroups):
            with pytest.raises(unidist.ConfigurationError, match=r"takes a unidist\.Group"):
                _call_with(name, keyword, [0])
    elif isinstance(verdict, Refused):
        with pytest.raises((TypeError, unidist.ConfigurationError)) as caught:
            _call_with(name, keyword, verdict.value)
        assert verdict.fragment in str(caught.value), str(caught.value)
    else:
        raise AssertionError(f"no check for {verdict!r}")


def _walk(module: Any, table: dict[str, dict[str, Verdict]]) -> None:
    shared = {
        name
        for name in dir(module)
        if not name.startswith("_")
        and inspect.isfunction(getattr(module, name))
        and hasattr(unidist, name)
        and name not in POINTERS
    }
    assert shared <= set(table), f"no verdicts for {sorted(shared - set(table))}"
    for name, verdicts in table.items():
        theirs = inspect.signature(getattr(module, name))
        keywords = {
            p.name if p.kind is not inspect.Parameter.VAR_KEYWORD else "kwargs"
            for p in theirs.parameters.values()
        }
        assert keywords == set(verdicts), (
            f"{module.__name__}.{name}{theirs}: verdicts for {sorted(verdicts)}; "
            f"missing {sorted(keywords - set(verdicts))}, stale {sorted(set(verdicts) - keywords)}"
        )
        for keyword, verdict in verdicts.items():
            if isinstance(verdict, Forwarded):
                for forwarded in sorted(verdict.target()):
                    _check(name, forwarded, verdict.verdict(forwarded), theirs)
            else:
                _check(name, keyword, verdict, theirs)


@dataclass(frozen=True)
class At:
    """Accepted at their position by unidist's parameter ``ours``, with the same meaning."""

    ours: str
    why: str = ""


@dataclass(frozen=True)
class RefusedThere:
    """Passed at their position, the call fails at once with an error containing ``fragment``."""

    fragment: str


Position = At | RefusedThere
#: Python's own error for one positional argument too many: the group is keyword-only here.
KEYWORD_ONLY = RefusedThere("positional argument")
VALUE = At("value", "unidist's first argument is a tensor or a Python number")

#: Where a positional parameter of theirs is not unidist's under the same name at the same
#: position: function -> parameter -> verdict. Every other position must match by name.
COMPOSER_POSITIONS: dict[str, dict[str, Position]] = {
    "barrier": {"group": RefusedThere("first argument is the timeout")},
    "all_reduce": {
        "tensor": VALUE,
        "reduce_operation": At("op", "'SUM' and 'sum' are one op: unidist reads any case"),
        "group": KEYWORD_ONLY,
    },
    "broadcast": {"tensor": VALUE, "group": KEYWORD_ONLY},
    "all_gather": {"group": KEYWORD_ONLY},
    "all_gather_object": {"group": KEYWORD_ONLY},
}

IGNITE_POSITIONS: dict[str, dict[str, Position]] = {
    "all_reduce": {"tensor": VALUE, "group": KEYWORD_ONLY},
    "all_gather": {"group": KEYWORD_ONLY},
    "broadcast": {"tensor": VALUE, "safe_mode": KEYWORD_ONLY},
    "one_rank_only": {"with_barrier": At("barrier", "a bool, default False, in both")},
    "auto_model": {"sync_bn": RefusedThere("pass sync_batchnorm=True by keyword")},
    # Ignite's spawn(backend, fn, args, kwargs_dict, nproc_per_node): a backend first is refused.
    "spawn": dict.fromkeys(
        ("backend", "fn", "args", "kwargs_dict", "nproc_per_node"),
        RefusedThere("unidist's takes the function first"),
    ),
}

#: Their positional arguments, in their order, for the calls that check the positions.
POSITIONAL_SAMPLES: dict[str, Callable[[], tuple[Any, ...]]] = {
    "barrier": lambda: ([0],),
    "all_reduce": lambda: (torch.ones(1), "SUM", [0]),
    "broadcast": lambda: (torch.ones(1), 0, True),
    "all_gather": lambda: (torch.ones(1), [0]),
    "all_gather_object": lambda: (1, [0]),
    "one_rank_only": lambda: (0, True),
    "auto_model": lambda: (nn.Linear(2, 2), True),
    "spawn": lambda: ("gloo", print, (1,), None, 2),
}

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _positions(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    parameters = inspect.signature(fn).parameters.values()
    return [p for p in parameters if p.kind in _POSITIONAL and p.name != "self"]


def _walk_positions(
    module: Any,
    names: set[str],
    table: dict[str, dict[str, Position]],
    samples: dict[str, Callable[[], tuple[Any, ...]]] = POSITIONAL_SAMPLES,
    keywords: dict[str, dict[str, Verdict]] | None = None,
) -> None:
    """Check each positional parameter of ``module``'s mirrored functions against ``table``.

    A parameter at its own place keeps its default, unless its keyword's verdict says the
    defaults are spelt differently (``Equivalent``). ``table[name]["*"]`` is the verdict for
    every parameter not named. A call of their shape passes at least their required arguments,
    so each check passes those too (``samples`` has their values, padded with None).
    """
    for name in sorted(names):
        theirs, ours = _positions(getattr(module, name)), _positions(getattr(unidist, name))
        verdicts = table.get(name, {})
        stale = set(verdicts) - {p.name for p in theirs} - {"*"}
        assert not stale, f"{module.__name__}.{name}: no positional parameters {sorted(stale)}"
        required = sum(p.default is inspect.Parameter.empty for p in theirs)

        def call(
            count: int, name: str = name, size: int = len(theirs), at_least: int = required
        ) -> None:
            values = (*samples[name](), *[None] * size)
            getattr(unidist, name)(*values[: max(count, at_least)])

        for index, parameter in enumerate(theirs):
            verdict = verdicts.get(parameter.name, verdicts.get("*"))
            where = f"{module.__name__}.{name}'s positional {parameter.name} (#{index})"
            if isinstance(verdict, RefusedThere):
                assert name in samples, f"{where}: add their arguments to the samples"
                with pytest.raises((TypeError, unidist.ConfigurationError)) as caught:
                    call(index + 1)
                assert verdict.fragment in str(caught.value), f"{where}: {caught.value}"
                continue
            expected = verdict.ours if isinstance(verdict, At) else parameter.name
            found = ours[index].name if index < len(ours) else None
            assert found == expected, f"{where} is unidist.{name}'s {found!r}, not {expected!r}"
            keyword = (keywords or {}).get(name, {}).get(parameter.name)
            if verdict is None and not isinstance(keyword, Equivalent):
                assert ours[index].default == parameter.default, f"{where}: another default"
            if name in samples:  # accepted there: the call of their shape runs
                call(index + 1)


class ProcessGroup:
    """A stand-in for a torch ``ProcessGroup`` (none exists without a live process group)."""


#: torch.distributed's functions (and torch's sampler) that unidist has under the same name.
TORCH_POSITIONS: dict[str, dict[str, Position]] = {
    "is_initialized": {},
    "get_rank": {"group": RefusedThere("takes a unidist.Group")},
    "get_world_size": {"group": RefusedThere("takes a unidist.Group")},
    "barrier": {"group": RefusedThere("first argument is the timeout"), "*": KEYWORD_ONLY},
    "all_reduce": {
        "tensor": VALUE,
        "op": RefusedThere("is not a reduction unidist knows"),  # a ReduceOp; names work
        "*": KEYWORD_ONLY,
    },
    "broadcast": {
        "tensor": VALUE,
        "src": At("src", "torch's None asks for group_src=; unidist defaults to rank 0"),
        "*": KEYWORD_ONLY,
    },
    # torch fills a list given first; unidist returns it: all_gather(out, t) is a TypeError.
    "all_gather": {"tensor_list": KEYWORD_ONLY, "*": KEYWORD_ONLY},
    "all_gather_object": {"object_list": KEYWORD_ONLY, "*": KEYWORD_ONLY},
    "new_group": {
        "ranks": At("ranks", "required: torch's default None (every rank) is a TypeError"),
        "*": KEYWORD_ONLY,
    },
    "DistributedSampler": {"dataset": At("data", "a dataset, or its length")},
}

TORCH_SAMPLES: dict[str, Callable[[], tuple[Any, ...]]] = {
    "get_rank": lambda: (ProcessGroup(),),
    "get_world_size": lambda: (ProcessGroup(),),
    "barrier": lambda: (ProcessGroup(),),
    "all_reduce": lambda: (torch.ones(1), torch.distributed.ReduceOp.SUM),
    "broadcast": lambda: (torch.ones(1), 0),
    "all_gather": lambda: ([torch.ones(1)], torch.ones(1)),
    "all_gather_object": lambda: ([None], 1),
    "new_group": lambda: ([0],),
    "DistributedSampler": lambda: (range(8), 2, 1, True, 0, False),
}


def test_every_positional_argument_of_torch_distributed_keeps_its_place_or_fails() -> None:
    import torch.distributed as dist
    import torch.utils.data.distributed as data_distributed

    shared = {
        name
        for name in dir(dist)
        if not name.startswith("_") and callable(getattr(dist, name)) and name in unidist.__all__
    }
    assert shared == set(TORCH_POSITIONS) - {"DistributedSampler"}, "verdicts for torch's names"
    _walk_positions(dist, shared, TORCH_POSITIONS, TORCH_SAMPLES)
    _walk_positions(data_distributed, {"DistributedSampler"}, TORCH_POSITIONS, TORCH_SAMPLES)


@pytest.mark.composer
def test_every_keyword_of_composer_dist_keeps_its_meaning_or_fails() -> None:
    from composer.utils import dist

    _walk(dist, COMPOSER)


@pytest.mark.composer
def test_every_positional_argument_of_composer_dist_keeps_its_place_or_fails() -> None:
    from composer.utils import dist

    _walk_positions(dist, set(COMPOSER), COMPOSER_POSITIONS, keywords=COMPOSER)


@pytest.mark.ignite
def test_every_keyword_of_ignite_distributed_keeps_its_meaning_or_fails() -> None:
    import ignite.distributed as idist

    _walk(idist, IGNITE)


@pytest.mark.ignite
def test_every_positional_argument_of_ignite_distributed_keeps_its_place_or_fails() -> None:
    import ignite.distributed as idist

    _walk_positions(idist, set(IGNITE), IGNITE_POSITIONS, keywords=IGNITE)


def test_ddp_keywords_are_what_auto_model_passes_on() -> None:
    assert ddp_keywords() == _ddp() - {"device_ids"}
