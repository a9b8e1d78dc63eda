"""An adapter is the pair it provides (its environment and its methods); an adapter without
``environment`` is refused with a message that says what to add."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unidist.adapters import registry
from unidist.adapters.base import Adapter
from unidist.environments import places as environments, variables as _env
from unidist.errors import ConfigurationError

from .._two_ranks import run_two_ranks
from .oneclass import OneClassAdapter, RackAdapter, Racks

ROOT = Path(__file__).resolve().parents[2]


def test_the_builtin_adapters_are_pairs() -> None:
    for name in ("torch", "serial"):
        adapter = registry.get(name)
        assert isinstance(adapter, Adapter)
    assert registry.get("torch").environment.name == "torch"  # type: ignore[union-attr]
    assert registry.get("serial").environment.name == "none"  # type: ignore[union-attr]


def test_an_adapter_without_an_environment_is_refused_with_what_to_add() -> None:
    registry.register("oneclass", OneClassAdapter)
    with pytest.raises(ConfigurationError) as caught:
        registry.get("oneclass")
    message = str(caught.value)
    assert "OneClassAdapter does not implement the adapter contract" in message
    assert "it has no environment." in message
    assert "HINT: give it `environment = None`" in message
    assert "'unidist.environments'" in message


def test_an_adapter_passed_as_an_object_without_an_environment_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"has no environment\. HINT: give it"):
        registry.choose(OneClassAdapter(), None, _env.read({}))  # type: ignore[arg-type]


def test_an_object_that_is_no_adapter_says_what_it_lacks() -> None:
    class Half:
        name = "half"

        def detect(self, env: object) -> None:
            return None

    with pytest.raises(ConfigurationError, match=r"has no environment, initialize, finalize"):
        registry.choose(Half(), None, _env.read({}))  # type: ignore[arg-type]


def test_a_third_party_adapters_environment_joins_the_chooser_once() -> None:
    registry.register("racks", RackAdapter)
    try:
        before = [e.name for e in environments.environments()]
        registry.get("racks")
        registry.register("racks2", RackAdapter)
        registry.get("racks2")  # an environment of the same type is not asked twice
        after = [e.name for e in environments.environments()]
        assert before == ["torch", "slurm", "openmpi", "mvapich", "mpich", "none"]
        assert after == ["torch", "racks", "slurm", "openmpi", "mvapich", "mpich", "none"]
        found = _env.read({"RACK_RANK": "1", "RACK_SIZE": "2", "RACK_HEAD": "h:9"})
        assert (found.launcher, found.rank, found.master_addr, found.master_port) == (
            "racks",
            1,
            "h",
            9,
        )
    finally:
        for one in environments.environments():
            if isinstance(one, Racks):
                environments.unregister(one)


JOB = """
import json
import torch, unidist
from tests.adapters.oneclass import RackAdapter
unidist.initialize("gloo", adapter=RackAdapter(), timeout=60)
total = unidist.all_reduce(torch.tensor([unidist.get_rank() + 1])).item()
print(json.dumps({"topology": unidist.topology().as_dict(), "total": total}))
unidist.finalize()
"""


@pytest.mark.multiprocess
def test_two_processes_train_where_their_adapters_environment_places_them() -> None:
    # Nothing but RACK_* is set: before the adapter is loaded unidist reads one process; the
    # adapter's environment joins the chooser and initialize reads the ranks from it.
    codes, outs = run_two_ranks(
        JOB,
        lambda rank, port: {
            "RACK_RANK": str(rank),
            "RACK_SIZE": "2",
            "RACK_HEAD": f"127.0.0.1:{port}",
        },
        [ROOT, ROOT / "src"],
        cwd=ROOT,
    )
    assert codes == [0, 0], outs
    for rank, (out, _) in enumerate(outs):
        result = json.loads(out.strip().splitlines()[-1])
        assert result["total"] == 3
        assert result["topology"]["launcher"] == "racks"
        assert (result["topology"]["rank"], result["topology"]["world_size"]) == (rank, 2)
