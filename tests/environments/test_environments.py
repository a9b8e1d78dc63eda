"""Environments: where a job runs, asked in order; third-party ones by entry point or register()."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from unidist import environments
from unidist.environments import EnvReading, places as builtin, reading, variables as _env
from unidist.errors import ConfigurationError, TopologyError
from unidist.testing import ConformanceError, check_environment

from .._two_ranks import run_two_ranks

SOURCE = Path(__file__).resolve().parents[2] / "src"

CLUSTER = """
from unidist.environments import reading


class MyCluster:
    name = "mycluster"
    creates_processes = True

    def detect(self, env):
        return "MYCLUSTER_TASK" in env

    def read(self, env):
        port = env.get("MYCLUSTER_PORT")
        return reading(
            launcher="mycluster",
            rank=int(env["MYCLUSTER_TASK"]),
            world_size=int(env["MYCLUSTER_TASKS"]),
            master_addr=env.get("MYCLUSTER_HEAD"),
            master_port=int(port) if port else None,
            sources={"rank": "MYCLUSTER_TASK", "world_size": "MYCLUSTER_TASKS"},
        )
"""


def _package(root: Path, entry: str = "mycluster_env:MyCluster") -> Path:
    """A package with MyCluster, installed in ``root`` with its entry point."""
    (root / "mycluster_env.py").write_text(CLUSTER)
    info = root / "mycluster_env-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mycluster-env\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[unidist.environments]\nmycluster = {entry}\n")
    return root


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(_package(tmp_path)))
    monkeypatch.setattr(builtin, "_from_entry_points", None)  # scan again, with the package
    yield tmp_path
    sys.modules.pop("mycluster_env", None)


def test_the_builtin_environments_are_asked_in_order() -> None:
    names = [e.name for e in environments.environments()]
    assert names == ["torch", "slurm", "openmpi", "mvapich", "mpich", "none"]


@pytest.mark.parametrize(
    "variables",
    [
        {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
        {
            "SLURM_PROCID": "3",
            "SLURM_STEP_ID": "0",
            "SLURM_NTASKS": "4",
            "SLURM_LOCALID": "1",
            "SLURM_TASKS_PER_NODE": "2(x2)",
            "SLURM_NODEID": "1",
            "SLURM_NNODES": "2",
            "SLURM_STEP_NODELIST": "n[1-2]",
            "SLURM_JOB_ID": "7",
        },
        {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"},
        {"PMI_RANK": "1", "PMI_SIZE": "2"},
        {},
    ],
    ids=["torch", "slurm", "openmpi", "mpich", "none"],
)
def test_read_is_the_reading_of_the_first_environment_that_detects(
    variables: Mapping[str, str],
) -> None:
    chosen = environments.choose(variables)
    assert chosen.read(variables) == _env.read(variables)
    if variables:  # one process (no variables) is the one environment that claims them all
        assert check_environment(chosen, variables) == _env.read(variables)


def test_a_registered_environment_is_asked_after_the_torch_variables() -> None:
    namespace: dict[str, object] = {}
    exec(CLUSTER, namespace)
    cluster = namespace["MyCluster"]()  # type: ignore[operator]
    mine = {
        "MYCLUSTER_TASK": "1",
        "MYCLUSTER_TASKS": "3",
        "SLURM_PROCID": "0",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "1",
    }
    assert _env.read(mine).launcher == "slurm"  # unknown until registered
    environments.register(cluster)  # type: ignore[arg-type]
    try:
        found = _env.read(mine)  # before SLURM
        assert (found.launcher, found.rank, found.world_size) == ("mycluster", 1, 3)
        assert found.missing == ("local_rank", "local_world_size", "node_rank", "num_nodes")
        torch_too = {**mine, "RANK": "0", "WORLD_SIZE": "1"}
        assert _env.read(torch_too).launcher == "env"  # the torch variables still win
    finally:
        environments.unregister(cluster)  # type: ignore[arg-type]
    assert _env.read(mine).launcher == "slurm"


def test_an_environment_by_entry_point(installed: Path) -> None:
    names = [e.name for e in environments.environments()]
    assert names[:2] == ["torch", "mycluster"]
    found = _env.read({"MYCLUSTER_TASK": "0", "MYCLUSTER_TASKS": "2"})
    assert (found.launcher, found.rank, found.world_size) == ("mycluster", 0, 2)


def test_a_broken_entry_point_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(_package(tmp_path, "mycluster_env:Missing")))
    monkeypatch.setattr(builtin, "_from_entry_points", None)
    with pytest.raises(ConfigurationError, match=r"the environment 'mycluster'.*Missing") as info:
        _env.read({})
    assert "HINT: fix or uninstall" in str(info.value)


def test_a_reading_is_checked_as_unidist_checks_its_own() -> None:
    with pytest.raises(TopologyError, match="MYCLUSTER_TASK=4 but MYCLUSTER_TASKS=2"):
        reading(
            launcher="mycluster",
            rank=4,
            world_size=2,
            sources={"rank": "MYCLUSTER_TASK", "world_size": "MYCLUSTER_TASKS"},
        )
    partial = reading(launcher="mycluster", rank=1, world_size=4)
    assert partial.missing == ("local_rank", "local_world_size", "node_rank", "num_nodes")


class _ClaimsEverything:
    name = "greedy"
    creates_processes = True

    def detect(self, env: Mapping[str, str]) -> bool:
        return True

    def read(self, env: Mapping[str, str]) -> EnvReading:
        return reading(launcher="greedy", rank=0, world_size=1)


class _ReturnsADict(_ClaimsEverything):
    def detect(self, env: Mapping[str, str]) -> bool:
        return "X" in env

    def read(self, env: Mapping[str, str]) -> EnvReading:
        return {"rank": 0}  # type: ignore[return-value]


class _RaisesWithAHint(_ReturnsADict):
    def read(self, env: Mapping[str, str]) -> EnvReading:
        # unidist's own refusal, whose HINT ends a sentence: "... or unidist launch."
        return builtin.TorchVariables().read({"WORLD_SIZE": "2"})


class _WritesTheEnvironment(_ReturnsADict):
    def read(self, env: Mapping[str, str]) -> EnvReading:
        os.environ["UNIDIST_TEST_WRITTEN"] = "1"
        return reading(launcher="writes", rank=0, world_size=1)


@pytest.mark.parametrize(
    ("environment", "symptom"),
    [
        (_ClaimsEverything, "would claim every single process"),
        (_ReturnsADict, "read returned dict, not an EnvReading"),
        (_WritesTheEnvironment, "changed this process's environment"),
        (_RaisesWithAHint, "torchrun or unidist launch."),
        (object(), "it has no name, creates_processes, detect, read"),
    ],
)
def test_check_environment_names_what_breaks_the_contract(
    environment: object, symptom: str
) -> None:
    try:
        with pytest.raises(ConformanceError, match=symptom) as info:
            check_environment(environment, {"X": "1"})
        assert symptom.rstrip(".") in info.value.report["environment"][0]
        assert ".." not in str(info.value).replace("...", "")  # one full stop per sentence
    finally:
        os.environ.pop("UNIDIST_TEST_WRITTEN", None)


JOB = """
import json, sys
import torch, unidist
unidist.initialize("gloo", timeout=60)
total = unidist.all_reduce(torch.tensor([unidist.get_rank() + 1])).item()
print(json.dumps({"topology": unidist.topology().as_dict(), "total": total}))
unidist.finalize()
"""


@pytest.mark.multiprocess
def test_two_processes_train_under_an_environment_from_an_entry_point(tmp_path: Path) -> None:
    _package(tmp_path)
    codes, outs = run_two_ranks(
        JOB,
        lambda rank, port: {
            "MYCLUSTER_TASK": str(rank),
            "MYCLUSTER_TASKS": "2",
            "MYCLUSTER_HEAD": "127.0.0.1",
            "MYCLUSTER_PORT": str(port),
        },
        [tmp_path, SOURCE],
    )
    assert codes == [0, 0], outs
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    for rank, result in enumerate(results):
        assert result["total"] == 3
        assert result["topology"] == {
            "rank": rank,
            "world_size": 2,
            "local_rank": rank,
            "local_world_size": 2,
            "node_rank": 0,
            "num_nodes": 1,
            "launcher": "mycluster",
        }
