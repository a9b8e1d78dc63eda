"""An adapter is the pair it provides (its environment and its methods); one-class adapters of
the pre-releases keep working through the shim, with a warning that says what to change."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import unidist
from unidist import _env
from unidist._env import environments
from unidist.adapters import registry
from unidist.adapters.base import Adapter
from unidist.adapters.legacy import LegacyShim
from unidist.errors import ConfigurationError
from unidist.testing import CLAUSES, run_distributed
from unidist.testing.conformance import run_clauses

from .oneclass import OneClassAdapter, RackAdapter, Racks

ROOT = Path(__file__).resolve().parents[2]


def test_the_builtin_adapters_are_pairs() -> None:
    for name in ("torch", "serial"):
        adapter = registry.get(name)
        assert isinstance(adapter, Adapter)
    assert registry.get("torch").environment.name == "torch"  # type: ignore[union-attr]
    assert registry.get("serial").environment.name == "none"  # type: ignore[union-attr]


def test_a_one_class_adapter_runs_through_the_shim_with_a_warning() -> None:
    registry.register("oneclass", OneClassAdapter)
    with pytest.warns(DeprecationWarning, match="compatibility shim") as caught:
        adapter = registry.get("oneclass")
    message = str(caught[0].message)
    assert "the adapter 'oneclass' (OneClassAdapter) has no `environment`" in message
    assert "has no `environment`" in message
    assert "'unidist.environments'" in message
    assert "'unidist.adapters'" in message
    assert "unidist 0.2 removes" in message
    assert isinstance(adapter, LegacyShim)
    assert isinstance(adapter, Adapter)
    assert adapter.environment is None
    assert adapter.name == "oneclass"
    assert adapter.calls == 0  # what the contract does not name is read from the adapter
    assert isinstance(adapter.legacy, OneClassAdapter)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert registry.get("oneclass") is adapter  # one instance: warned once


def test_an_adapter_passed_as_an_object_is_shimmed_too() -> None:
    with pytest.warns(DeprecationWarning, match="has no `environment`"):
        chosen, why = registry.choose(OneClassAdapter(), None, _env.read({}))
    assert isinstance(chosen, LegacyShim)
    assert why == "passed as an object"


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


def _shimmed_job() -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        registry.register("oneclass", OneClassAdapter, override=True)
        unidist.initialize("gloo", adapter="oneclass", timeout=60)
    report = run_clauses(list(CLAUSES))
    adapter = unidist.current_adapter()
    calls = adapter.calls  # type: ignore[attr-defined]
    unidist.finalize()
    return {
        "report": report,
        "warned": [w.category.__name__ for w in caught if "environment" in str(w.message)],
        "calls": calls,
    }


@pytest.mark.multiprocess
def test_a_one_class_adapter_passes_every_clause_over_two_processes() -> None:
    results = run_distributed(_shimmed_job, world_size=2, timeout=180, init=False)
    for rank, result in enumerate(results):
        failed = {name: why for name, why in result["report"].items() if why}
        assert failed == {}, (rank, failed)
        assert result["warned"] == ["DeprecationWarning"]
        assert result["calls"] > 10  # every collective went through it


JOB = """
import json
import torch, unidist
from tests.adapters.oneclass import RackAdapter
unidist.initialize("gloo", adapter=RackAdapter(), timeout=60)
total = unidist.all_reduce(torch.tensor([unidist.get_rank() + 1])).item()
print(json.dumps({"topology": unidist.topology().as_dict(), "total": total}))
unidist.finalize()
"""

#: What would place the ranks before the adapter's environment could.
_OTHER_PLACES = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "UNIDIST_LAUNCHER",
    "UNIDIST_PROGRESS",
    "TORCHELASTIC_RUN_ID",
    "SLURM_PROCID",
    "SLURM_STEP_ID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.multiprocess
def test_two_processes_train_where_their_adapters_environment_places_them() -> None:
    # Nothing but RACK_* is set: before the adapter is loaded unidist reads one process; the
    # adapter's environment joins the chooser and initialize reads the ranks from it.
    base = {k: v for k, v in _env.environ_copy().items() if k not in _OTHER_PLACES}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src")])
    for _attempt in range(3):  # a port another program took in between: choose again
        head = f"127.0.0.1:{_free_port()}"
        ranks = [
            subprocess.Popen(
                [sys.executable, "-c", JOB],
                env={**base, "RACK_RANK": str(rank), "RACK_SIZE": "2", "RACK_HEAD": head},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=ROOT,
            )
            for rank in range(2)
        ]
        outs = [rank.communicate(timeout=180) for rank in ranks]
        if all(rank.returncode == 0 for rank in ranks):
            break
        if not any("ddress already in use" in err for _, err in outs):
            break
    assert [rank.returncode for rank in ranks] == [0, 0], outs
    for rank, (out, _) in enumerate(outs):
        result = json.loads(out.strip().splitlines()[-1])
        assert result["total"] == 3
        assert result["topology"]["launcher"] == "racks"
        assert (result["topology"]["rank"], result["topology"]["world_size"]) == (rank, 2)
