"""Table-driven tests of the environment parser: every launcher, every malformed case."""

from __future__ import annotations

from typing import Any

import pytest

import unidist
from unidist.environments import variables as _env
from unidist.errors import ConfigurationError, TopologyError

MASTER = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}

# name, environment, expected fields (None = unknown until initialize)
GOOD: list[tuple[str, dict[str, str], dict[str, Any]]] = [
    (
        "none",
        {},
        dict(
            launcher="none",
            rank=0,
            world_size=1,
            local_rank=0,
            local_world_size=1,
            node_rank=0,
            num_nodes=1,
        ),
    ),
    (
        "torchrun single node",
        {
            "RANK": "1",
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "0",
            "GROUP_WORLD_SIZE": "1",
            "TORCHELASTIC_RUN_ID": "abc",
            **MASTER,
        },
        dict(
            launcher="torchrun",
            rank=1,
            world_size=2,
            local_rank=1,
            local_world_size=2,
            node_rank=0,
            num_nodes=1,
            master_addr="10.0.0.1",
            master_port=29500,
        ),
    ),
    (
        "torchrun second node: GROUP_RANK without NODE_RANK",
        {
            "RANK": "3",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "1",
            "GROUP_WORLD_SIZE": "2",
            "TORCHELASTIC_RUN_ID": "abc",
            **MASTER,
        },
        dict(
            launcher="torchrun",
            rank=3,
            world_size=4,
            local_rank=1,
            local_world_size=2,
            node_rank=1,
            num_nodes=2,
        ),
    ),
    (
        "torchrun heterogeneous nodes",
        {
            "RANK": "4",
            "WORLD_SIZE": "5",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "GROUP_RANK": "1",
            "GROUP_WORLD_SIZE": "2",
            "TORCHELASTIC_RUN_ID": "abc",
            **MASTER,
        },
        dict(
            launcher="torchrun", rank=4, world_size=5, local_world_size=1, node_rank=1, num_nodes=2
        ),
    ),
    (
        "unidist launch",
        {
            "UNIDIST_LAUNCHER": "launch",
            "TORCHELASTIC_RUN_ID": "x",
            "RANK": "0",
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "0",
            "NODE_RANK": "0",
            **MASTER,
        },
        dict(launcher="unidist", rank=0, world_size=2, node_rank=0, num_nodes=1),
    ),
    (
        "composer launcher, second node",
        {
            "RANK": "2",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "2",
            "NODE_RANK": "1",
            **MASTER,
        },
        dict(
            launcher="composer",
            rank=2,
            world_size=4,
            local_rank=0,
            local_world_size=2,
            node_rank=1,
            num_nodes=2,
        ),
    ),
    (
        "ignite spawn: no LOCAL_WORLD_SIZE",
        {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", **MASTER},
        dict(
            launcher="env",
            rank=1,
            world_size=2,
            local_rank=1,
            local_world_size=None,
            node_rank=None,
            num_nodes=None,
        ),
    ),
    (
        "single-process defaults written by Composer",
        {
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "NODE_RANK": "0",
        },
        dict(launcher="composer", rank=0, world_size=1, num_nodes=1),
    ),
    (
        "WORLD_SIZE=1 alone",
        {"WORLD_SIZE": "1"},
        dict(launcher="env", rank=0, world_size=1, local_rank=0, node_rank=0),
    ),
    (
        "slurm srun step",
        {
            "SLURM_JOB_ID": "12345",
            "SLURM_STEP_ID": "0",
            "SLURM_PROCID": "3",
            "SLURM_NTASKS": "4",
            "SLURM_LOCALID": "1",
            "SLURM_NODEID": "1",
            "SLURM_NNODES": "2",
            "SLURM_TASKS_PER_NODE": "2(x2)",
            "SLURM_STEP_NODELIST": "gpu[01-02]",
        },
        dict(
            launcher="slurm",
            rank=3,
            world_size=4,
            local_rank=1,
            local_world_size=2,
            node_rank=1,
            num_nodes=2,
            master_addr="gpu01",
            master_port=15000 + 2345,
        ),
    ),
    (
        "slurm uneven tasks per node",
        {
            "SLURM_JOB_ID": "7",
            "SLURM_STEP_ID": "1",
            "SLURM_PROCID": "3",
            "SLURM_STEP_NUM_TASKS": "4",
            "SLURM_NTASKS": "8",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "1",
            "SLURM_STEP_NUM_NODES": "2",
            "SLURM_STEP_TASKS_PER_NODE": "3,1",
            "SLURM_JOB_NODELIST": "a,b",
            "MASTER_PORT": "1234",
        },
        dict(
            launcher="slurm",
            rank=3,
            world_size=4,
            local_rank=0,
            local_world_size=1,
            node_rank=1,
            num_nodes=2,
            master_addr="a",
            master_port=1234,
        ),
    ),
    (
        "sbatch script without srun",
        {"SLURM_JOB_ID": "99", "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0"},
        dict(launcher="none", rank=0, world_size=1),
    ),
    (
        "srun --pty bash",
        {
            "SLURM_JOB_ID": "99",
            "SLURM_STEP_ID": "0",
            "SLURM_JOB_NAME": "bash",
            "SLURM_PROCID": "0",
            "SLURM_NTASKS": "4",
        },
        dict(launcher="none", world_size=1),
    ),
    (
        "torchrun inside an srun step: torch variables win",
        {
            "SLURM_JOB_ID": "99",
            "SLURM_STEP_ID": "0",
            "SLURM_PROCID": "0",
            "SLURM_NTASKS": "2",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
            "TORCHELASTIC_RUN_ID": "r",
            "RANK": "5",
            "WORLD_SIZE": "8",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "4",
            "GROUP_RANK": "1",
            **MASTER,
        },
        dict(launcher="torchrun", rank=5, world_size=8, local_rank=1, node_rank=1, num_nodes=2),
    ),
    (
        "openmpi: nodes from host names at initialize",
        {
            "OMPI_COMM_WORLD_RANK": "2",
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            **MASTER,
        },
        dict(
            launcher="openmpi",
            rank=2,
            world_size=4,
            local_rank=0,
            local_world_size=2,
            node_rank=None,
            num_nodes=None,
        ),
    ),
    (
        "mpich / intel mpi (PMI)",
        {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
        dict(
            launcher="mpich",
            rank=1,
            world_size=2,
            local_rank=1,
            local_world_size=2,
            master_addr=None,
        ),
    ),
    (
        "mvapich",
        {
            "MV2_COMM_WORLD_RANK": "0",
            "MV2_COMM_WORLD_SIZE": "3",
            "MV2_COMM_WORLD_LOCAL_RANK": "0",
            "MV2_COMM_WORLD_LOCAL_SIZE": "3",
        },
        dict(launcher="mvapich", rank=0, world_size=3, local_world_size=3),
    ),
]


@pytest.mark.parametrize(
    ("environ", "expected"), [(e, x) for _, e, x in GOOD], ids=[name for name, _, _ in GOOD]
)
def test_reads_launcher(environ: dict[str, str], expected: dict[str, Any]) -> None:
    reading = _env.read(environ)
    got = {name: getattr(reading, name) for name in expected}
    assert got == expected, reading.notes


BAD: list[tuple[str, dict[str, str], str]] = [
    ("RANK not a number", {"RANK": "abc", "WORLD_SIZE": "2"}, "RANK='abc' is not an integer"),
    (
        "RANK >= WORLD_SIZE",
        {"RANK": "2", "WORLD_SIZE": "2"},
        "RANK=2 but WORLD_SIZE=2: the rank must be below the world size",
    ),
    (
        "LOCAL_RANK without WORLD_SIZE",
        {"LOCAL_RANK": "0"},
        "LOCAL_RANK='0' is set but WORLD_SIZE is not",
    ),
    ("RANK without WORLD_SIZE", {"RANK": "1"}, "RANK='1' is set but WORLD_SIZE is not"),
    ("WORLD_SIZE without RANK", {"WORLD_SIZE": "2"}, "WORLD_SIZE='2' is set but RANK is not"),
    ("WORLD_SIZE zero", {"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0' is below 1"),
    ("negative rank", {"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1' is below 0"),
    (
        "NODE_RANK and GROUP_RANK disagree",
        {"RANK": "0", "WORLD_SIZE": "2", "NODE_RANK": "1", "GROUP_RANK": "0"},
        "NODE_RANK='1' and GROUP_RANK='0' disagree",
    ),
    (
        "LOCAL_RANK >= LOCAL_WORLD_SIZE",
        {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
        "LOCAL_RANK=2 but LOCAL_WORLD_SIZE=2",
    ),
    (
        "LOCAL_WORLD_SIZE > WORLD_SIZE",
        {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"},
        "LOCAL_WORLD_SIZE=4 is larger than WORLD_SIZE=2",
    ),
    (
        "LOCAL_RANK > RANK",
        {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
        "LOCAL_RANK=1 is larger than RANK=0",
    ),
    (
        "NODE_RANK >= number of nodes",
        {
            "RANK": "1",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2",
            "NODE_RANK": "2",
        },
        "NODE_RANK=2 but there are 2 nodes",
    ),
    (
        "MASTER_PORT out of range",
        {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"},
        "MASTER_PORT='70000' is not a TCP port",
    ),
    ("NODE_RANK alone", {"NODE_RANK": "1"}, "NODE_RANK='1' is set but WORLD_SIZE and RANK are not"),
    (
        "OpenMPI rank without size",
        {"OMPI_COMM_WORLD_RANK": "0"},
        "OMPI_COMM_WORLD_RANK='0' is set but OMPI_COMM_WORLD_SIZE is not",
    ),
    (
        "SLURM rank >= tasks",
        {"SLURM_STEP_ID": "0", "SLURM_PROCID": "4", "SLURM_NTASKS": "4", "SLURM_NODEID": "0"},
        "SLURM_PROCID=4 but SLURM_NTASKS=4",
    ),
    (
        "SLURM tasks per node malformed",
        {
            "SLURM_STEP_ID": "0",
            "SLURM_PROCID": "0",
            "SLURM_NTASKS": "2",
            "SLURM_NODEID": "0",
            "SLURM_TASKS_PER_NODE": "two",
        },
        "SLURM_TASKS_PER_NODE='two' is not in SLURM's tasks-per-node format",
    ),
]


@pytest.mark.parametrize(
    ("environ", "message"), [(e, m) for _, e, m in BAD], ids=[name for name, _, _ in BAD]
)
def test_rejects_malformed(environ: dict[str, str], message: str) -> None:
    with pytest.raises(TopologyError) as caught:
        _env.read(environ)
    assert message in str(caught.value)
    assert "HINT" in str(caught.value) or "format" in str(caught.value)


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node1", ["node1"]),
        ("a,b,c", ["a", "b", "c"]),
        ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),
        ("gpu[08-10,7]", ["gpu08", "gpu09", "gpu10", "gpu7"]),
        ("r[1-2]-n[01-02]", ["r1-n01", "r1-n02", "r2-n01", "r2-n02"]),
        ("x[1-2],y,z[5]", ["x1", "x2", "y", "z5"]),
    ],
)
def test_expands_slurm_hostlists(text: str, hosts: list[str]) -> None:
    assert _env.expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["gpu[01-03", "gpu]01[", "gpu[a-b]", "gpu[5-3]"])
def test_rejects_malformed_hostlists(text: str) -> None:
    with pytest.raises(TopologyError, match="host list"):
        _env.expand_hostlist(text)


def test_settings_reject_a_bad_timeout() -> None:
    with pytest.raises(
        ConfigurationError, match="UNIDIST_TIMEOUT must be a positive number of seconds, got 'soon'"
    ):
        _env.read_settings({"UNIDIST_TIMEOUT": "soon"})
    assert _env.read_settings({"UNIDIST_TIMEOUT": "12.5", "UNIDIST_ADAPTER": "ignite"}) == (
        _env.OwnSettings(adapter="ignite", timeout=12.5)
    )


def test_getters_follow_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in GOOD[2][1].items():  # torchrun, second node
        monkeypatch.setenv(name, value)
    assert (unidist.get_rank(), unidist.get_world_size()) == (3, 4)
    assert (unidist.get_local_rank(), unidist.get_local_world_size()) == (1, 2)
    assert (unidist.get_node_rank(), unidist.get_num_nodes()) == (1, 2)
    assert not unidist.is_main_process()
    assert unidist.topology().launcher == "torchrun"


def test_unknown_local_values_raise_until_initialize(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in GOOD[6][1].items():  # ignite spawn: no LOCAL_WORLD_SIZE
        monkeypatch.setenv(name, value)
    assert unidist.get_rank() == 1
    assert unidist.get_local_rank() == 1
    with pytest.raises(TopologyError, match=r"local_world_size is unknown.*unidist.initialize"):
        unidist.get_local_world_size()
    with pytest.raises(TopologyError, match="does not say local_world_size, node_rank"):
        unidist.topology()


def test_patched_restores_only_what_it_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    with _env.patched({"RANK": "0", "WORLD_SIZE": "4"}) as applied:
        assert applied == {"WORLD_SIZE": "4"}
        assert _env.read_settings() == _env.OwnSettings()
    assert not _env.is_set("WORLD_SIZE")
    assert _env.snapshot(("RANK",)) == {"RANK": "3"}
