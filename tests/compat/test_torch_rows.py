"""docs/migration/torch.md's launcher and data/model rows, checked against torch and torchrun.

Each test runs torch's spelling of a row (torchrun, ``os.environ``, ``DistributedSampler``,
``DistributedDataParallel``, ``torch.multiprocessing.spawn``, ...) and unidist's on the same
inputs, with 1 and 2 processes where the row is about several, and compares what they give or
how they fail. tests/compat/_torch_rows.py names the tests of each row; tests/test_docs.py checks
that every row of the page has one.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import unidist
from tests.launch.helpers import LOGS_SPECS, free_port, launch, run_in_process
from tests.launch.test_torchrun_contract import PER_RUN, TORCHRUN_VARIABLES
from unidist._base.workarounds import GLOO_AVG_SUMS, GLOO_TEARDOWN_DEADLOCK
from unidist.testing import run_distributed

pytestmark = pytest.mark.multiprocess

# -- the launcher ---------------------------------------------------------------------------------

#: What each rank reports: torchrun's variables, its argv, and every row's two spellings (torch's
#: reading of the variables, unidist's getters) of the topology; of the device too where the
#: test sets ``DEVICES`` (the standalone row): reading it imports torch, seconds of CPU per rank,
#: and no other row's options change which device a rank gets.
DEVICES = {"ROWS_READ_DEVICES": "1"}
RANK_SCRIPT = """
import argparse, json, os, sys
import unidist

parser = argparse.ArgumentParser()
parser.add_argument("out")
# torch.distributed.launch passed --local_rank; a script ported from it still declares it.
parser.add_argument("--local_rank", "--local-rank", type=int, default=-1)
args = parser.parse_args()


def variable(name):
    try:
        return int(os.environ[name])
    except KeyError:
        return "KeyError"


ours = {
    "local_rank": unidist.get_local_rank(),
    "rank": unidist.get_rank(),
    "world_size": unidist.get_world_size(),
    "local_world_size": unidist.get_local_world_size(),
    "node_rank": unidist.get_node_rank(),
    "num_nodes": unidist.get_num_nodes(),
}
theirs = {
    "local_rank": variable("LOCAL_RANK"),
    "rank": variable("RANK"),
    "world_size": variable("WORLD_SIZE"),
    "local_world_size": variable("LOCAL_WORLD_SIZE"),
    "node_rank": variable("GROUP_RANK"),
    "num_nodes": variable("GROUP_WORLD_SIZE"),
}
if os.environ.get("ROWS_READ_DEVICES") == "1":
    import torch

    ours["device"] = ours["accelerator_device"] = str(unidist.device())
    theirs["device"] = theirs["accelerator_device"] = "cpu"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available() and local_rank >= torch.cuda.device_count():
        # More ranks than GPUs: torch's spelling fails (invalid device ordinal); not this case.
        ours["device"] = ours["accelerator_device"] = theirs["device"] = "more ranks than GPUs"
        theirs["accelerator_device"] = theirs["device"]
    elif torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        theirs["device"] = f"cuda:{torch.cuda.current_device()}"
        torch.accelerator.set_device_index(local_rank)
        kind = torch.accelerator.current_accelerator().type
        theirs["accelerator_device"] = f"{kind}:{torch.accelerator.current_device_index()}"
print(f"payload {os.environ.get('RANK')}", flush=True)
name = os.environ.get("RANK", "plain")
with open(os.path.join(args.out, name + ".json"), "w") as out:
    json.dump(
        {
            "env": dict(os.environ),
            "argv": sys.argv[1:],
            "local_rank_option": args.local_rank,
            "torch": theirs,
            "unidist": ours,
        },
        out,
    )
"""

Ranks = dict[int, dict[str, Any]]


def _script(folder: Path) -> Path:
    path = folder / "rows_dump.py"
    if not path.exists():
        path.write_text(textwrap.dedent(RANK_SCRIPT))
    return path


def _torchrun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """torchrun ARGS (torch's own ``torch.distributed.run``) in a new process."""
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **(env or {})},
    )


def _unidist(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return launch(*args, env=env)


Launcher = Callable[..., subprocess.CompletedProcess[str]]


def _run(
    tmp_path: Path,
    label: str,
    launcher: Launcher,
    options: list[str],
    *,
    env: dict[str, str] | None = None,
    target: list[str] | None = None,
) -> tuple[subprocess.CompletedProcess[str], Ranks]:
    """Run the rank script under ``launcher`` with ``options``; its exit and every rank's record."""
    out = tmp_path / label
    out.mkdir()
    done = launcher(*options, *(target or [str(_script(tmp_path))]), str(out), env=env)
    return done, {int(p.stem): json.loads(p.read_text()) for p in out.glob("[0-9]*.json")}


def _ran(
    tmp_path: Path,
    label: str,
    launcher: Launcher,
    options: list[str],
    *,
    env: dict[str, str] | None = None,
    target: list[str] | None = None,
) -> Ranks:
    done, ranks = _run(tmp_path, label, launcher, options, env=env, target=target)
    assert done.returncode == 0, f"{label}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return ranks


def _assert_same_ranks(
    theirs: Ranks, mine: Ranks, nproc: int, per_run: tuple[str, ...] = PER_RUN
) -> None:
    """unidist's ranks got torchrun's variables (those not ``per_run``), the same argv shape, and
    unidist's getters answer what torch's reading of the variables says, under both."""
    assert sorted(theirs) == list(range(nproc)), sorted(theirs)
    assert sorted(mine) == list(range(nproc)), sorted(mine)
    for rank in range(nproc):
        them, us = theirs[rank], mine[rank]
        for name in TORCHRUN_VARIABLES:
            assert (name in us["env"]) == (name in them["env"]), f"rank {rank}: {name}"
            if name in them["env"] and name not in per_run:
                assert us["env"][name] == them["env"][name], f"rank {rank}: {name}"
        assert us["torch"] == them["torch"], f"rank {rank}"
        assert them["unidist"] == them["torch"], f"rank {rank} under torchrun"
        assert us["unidist"] == us["torch"], f"rank {rank} under unidist launch"
        for record in (them, us):  # neither launcher passes --local_rank
            assert len(record["argv"]) == 1, record["argv"]
            assert record["local_rank_option"] == -1


#: The rendezvous forms (--nproc-per-node alone, static, c10d) are compared on 2 ranks: what a
#: form changes (MASTER_ADDR, the run id, the store) does not depend on the count, and a world
#: of one is compared under --standalone (test_standalone_gives_torchruns_ranks[1]) and spawn.
#: Each comparison is two launches, 5-9 s of CPU, in each environment of the matrix.
RENDEZVOUS_WORLDS = [2]


@pytest.mark.parametrize("nproc", RENDEZVOUS_WORLDS)
def test_nproc_per_node_starts_torchruns_ranks(
    tmp_path: Path, nproc: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """``torchrun --nproc-per-node N`` and ``unidist launch -n N`` (or torchrun's spellings)."""
    # torchrun's default static rendezvous listens on 29500; its variable moves it to a free port.
    theirs = _ran(
        tmp_path,
        "torchrun",
        _torchrun,
        ["--nproc-per-node", str(nproc)],
        env={"PET_MASTER_PORT": str(free_port())},
    )
    mine = _ran(tmp_path, "unidist", _unidist, ["-n", str(nproc)])
    # On one node unidist always rendezvouses as torchrun's --standalone does (the next row
    # of the page): MASTER_ADDR is that form's "localhost", not the static form's 127.0.0.1.
    _assert_same_ranks(theirs, mine, nproc, (*PER_RUN, "MASTER_ADDR"))
    assert {r["env"]["MASTER_ADDR"] for r in mine.values()} == {"localhost"}
    # torchrun's two spellings plan the very job -n plans (one launch each cost seconds of CPU).
    plans = {
        option: run_in_process(capsys, "--dry-run", option, str(nproc), str(_script(tmp_path)))
        for option in ("-n", "--nproc-per-node", "--nproc_per_node")
    }
    assert plans["-n"][0] == 0, plans["-n"]
    assert f"processes      {nproc} on this node" in plans["-n"][1], plans["-n"][1]
    assert plans["--nproc-per-node"] == plans["--nproc_per_node"] == plans["-n"]


@pytest.mark.parametrize("nproc", [1, 2])
def test_standalone_gives_torchruns_ranks(tmp_path: Path, nproc: int) -> None:
    """``torchrun --standalone`` and ``unidist launch --standalone``, or no option at all; and the
    topology getters: ``int(os.environ["LOCAL_RANK"])`` and the other variables against
    unidist's getters, ``unidist.device()`` against ``torch.cuda.set_device(local_rank)``, under
    both launchers; without a launcher torch's reading raises KeyError and unidist answers a
    world of one."""
    options = ["--standalone", "--nproc-per-node", str(nproc)]
    theirs = _ran(tmp_path, "torchrun", _torchrun, options, env=DEVICES)
    standalone = _ran(
        tmp_path, "standalone", _unidist, ["--standalone", "-n", str(nproc)], env=DEVICES
    )
    _assert_same_ranks(theirs, standalone, nproc)
    for ranks in (theirs, standalone):
        assert all({"device", "accelerator_device"} <= set(r["torch"]) for r in ranks.values())
    plain = _ran(tmp_path, "plain", _unidist, ["-n", str(nproc)], env=DEVICES)
    _assert_same_ranks(theirs, plain, nproc)
    _assert_the_getters_answer(plain, nproc, tmp_path)


def _c10d(nproc: int, conf: str = "join_timeout=60") -> list[str]:
    return [
        "--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{free_port()}",
        "--rdzv-id", "rows-c10d", "--rdzv-conf", conf, "--nproc-per-node", str(nproc),
    ]  # fmt: skip


@pytest.mark.parametrize("nproc", RENDEZVOUS_WORLDS)
def test_the_c10d_rendezvous_options_give_torchruns_ranks(tmp_path: Path, nproc: int) -> None:
    """The c10d form (with ``--rdzv-conf``): torchrun's variables, the given run id."""
    theirs = _ran(tmp_path, "torchrun", _torchrun, _c10d(nproc))
    mine = _ran(tmp_path, "unidist", _unidist, _c10d(nproc))
    _assert_same_ranks(theirs, mine, nproc)
    for ranks in (theirs, mine):  # the id given, not a fresh one
        assert {r["env"]["TORCHELASTIC_RUN_ID"] for r in ranks.values()} == {"rows-c10d"}


def test_a_rdzv_conf_key_torch_would_ignore_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    """A mistyped ``--rdzv-conf`` key: torchrun runs without it, unidist refuses it with the
    key it meant before any rank starts."""
    done, theirs = _run(tmp_path, "torchrun", _torchrun, _c10d(2, "join_timout=60"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(theirs) == [0, 1]  # torchrun ran the job without the timeout meant
    done, mine = _run(tmp_path, "unidist", _unidist, _c10d(2, "join_timout=60"))
    assert done.returncode == 2
    assert "--rdzv-conf key 'join_timout' is not read by the c10d rendezvous" in done.stderr
    assert "did you mean join_timeout?" in done.stderr
    assert mine == {}


def _static(nproc: int) -> list[str]:
    return [
        "--nnodes", "1", "--node-rank", "0", "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), "--nproc-per-node", str(nproc),
    ]  # fmt: skip


@pytest.mark.parametrize("nproc", RENDEZVOUS_WORLDS)
def test_the_static_rendezvous_options_give_torchruns_ranks(tmp_path: Path, nproc: int) -> None:
    """The static form on one node: torchrun's variables, MASTER_ADDR included."""
    theirs = _ran(tmp_path, "torchrun", _torchrun, _static(nproc))
    mine = _ran(tmp_path, "unidist", _unidist, _static(nproc))
    _assert_same_ranks(theirs, mine, nproc)
    for rank in range(nproc):
        assert mine[rank]["env"]["MASTER_ADDR"] == theirs[rank]["env"]["MASTER_ADDR"]


def _assert_the_getters_answer(mine: Ranks, nproc: int, tmp_path: Path) -> None:
    """unidist's getters give each rank's topology under ``unidist launch -n nproc``, and a world
    of one in a plain process, where torch's reading of the variables raises KeyError."""
    for rank in range(nproc):
        expected = {
            "local_rank": rank,
            "rank": rank,
            "world_size": nproc,
            "local_world_size": nproc,
            "node_rank": 0,
            "num_nodes": 1,
        }
        got = {k: v for k, v in mine[rank]["unidist"].items() if "device" not in k}
        assert got == expected
    folder = tmp_path / "no-launcher"
    folder.mkdir()
    command = [sys.executable, str(_script(tmp_path)), str(folder)]
    subprocess.run(command, check=True, timeout=120, env={**os.environ, **DEVICES})
    alone = json.loads((folder / "plain.json").read_text())
    assert {k: v for k, v in alone["torch"].items() if "device" not in k} == dict.fromkeys(
        ("local_rank", "rank", "world_size", "local_world_size", "node_rank", "num_nodes"),
        "KeyError",
    )
    assert alone["unidist"] == {
        "local_rank": 0,
        "rank": 0,
        "world_size": 1,
        "local_world_size": 1,
        "node_rank": 0,
        "num_nodes": 1,
        "device": alone["torch"]["device"],
        "accelerator_device": alone["torch"]["accelerator_device"],
    }


def _torchrun_has(option: str) -> bool:
    from torch.distributed.run import get_args_parser

    return option in get_args_parser()._option_string_actions


def _payload_lines(text: str) -> list[str]:
    return sorted(line for line in text.splitlines() if "payload" in line)


def _logged_payloads(folder: Path) -> list[str]:
    return sorted(
        line
        for log in folder.rglob("*stdout.log")
        for line in log.read_text().splitlines()
        if "payload" in line
    )


PREFIX = "<${role_name}:${rank}> "


def test_torchruns_agent_options_give_the_same_ranks(tmp_path: Path) -> None:
    """``--max-restarts``, ``--monitor-interval``, ``--role``, ``--start-method``."""
    options = [
        "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval",
        "0.5", "--role", "trainer", "--start-method", "spawn",
    ]  # fmt: skip
    theirs = _ran(tmp_path, "torchrun", _torchrun, options)
    mine = _ran(tmp_path, "unidist", _unidist, options)
    _assert_same_ranks_with_restarts(theirs, mine, 2)
    for rank in (0, 1):
        assert mine[rank]["env"]["ROLE_NAME"] == "trainer"
        assert mine[rank]["env"]["TORCHELASTIC_MAX_RESTARTS"] == "1"


def _assert_same_ranks_with_restarts(theirs: Ranks, mine: Ranks, nproc: int) -> None:
    """As :func:`_assert_same_ranks`, for a job that may restart: there unidist gives each
    rendezvous round a fresh store on rank 0 instead of the agent's (torch reuses the agent's
    store without a per-round prefix, and gloo then reads the previous round's addresses:
    ``STATIC_STORE_REUSED`` in unidist._base.workarounds), so the ranks are told not to use it."""
    _assert_same_ranks(theirs, mine, nproc, (*PER_RUN, "TORCHELASTIC_USE_AGENT_STORE"))
    for rank in range(nproc):
        assert theirs[rank]["env"]["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert mine[rank]["env"]["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert mine[rank]["env"]["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


@pytest.mark.parametrize("form", ["tee", "redirects"])
def test_torchruns_output_options_show_and_log_what_torchrun_does(
    tmp_path: Path, form: str
) -> None:
    """``--log-dir``, ``-t``/``-r``, ``--local-ranks-filter``, ``--log-line-prefix-template``."""
    shared = ["--standalone", "--nproc-per-node", "2"]
    if form == "tee":
        shared += ["-t", "3", "--local-ranks-filter", "1"]
    else:
        shared += ["-r", "3"]
    # torch 2.7's torchrun reads the prefix template from its variable only.
    prefix = (
        (["--log-line-prefix-template", PREFIX], None)
        if _torchrun_has("--log-line-prefix-template")
        else ([], {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": PREFIX})
    )
    outputs = {}
    for label, launcher, extra, env in (
        ("torchrun", _torchrun, *prefix),
        ("unidist", _unidist, ["--log-line-prefix-template", PREFIX], None),
    ):
        logs = tmp_path / f"{label}-logs"
        done, ranks = _run(
            tmp_path, label, launcher, [*shared, *extra, "--log-dir", str(logs)], env=env
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert sorted(ranks) == [0, 1]
        outputs[label] = (_payload_lines(done.stdout), _logged_payloads(logs))
    assert outputs["unidist"] == outputs["torchrun"]
    shown, logged = outputs["torchrun"]
    assert shown == (["<default:1> payload 1"] if form == "tee" else [])
    assert logged == ["payload 0", "payload 1"]


@pytest.mark.parametrize("form", ["-m", "--no-python", "--run-path"])
def test_torchruns_program_options_run_the_same_program(tmp_path: Path, form: str) -> None:
    """``-m``, ``--no-python`` and ``--run-path`` run the same program with the same ranks."""
    script = _script(tmp_path)
    target = {
        "-m": ["-m", "rows_dump"],
        "--no-python": ["--no-python", sys.executable, str(script)],
        "--run-path": ["--run-path", str(script)],
    }[form]
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = {"PYTHONPATH": path}
    options = ["--standalone", "--nproc-per-node", "2"]
    theirs = _ran(tmp_path, "torchrun", _torchrun, options, env=env, target=target)
    mine = _ran(tmp_path, "unidist", _unidist, options, env=env, target=target)
    _assert_same_ranks(theirs, mine, 2)


def test_logs_specs_takes_the_entry_point_torchrun_takes(tmp_path: Path) -> None:
    """A ``torchrun.logs_specs`` entry point shapes both launchers' ranks; a missing one fails
    both before any rank starts (torchrun with a traceback, unidist with one line)."""
    plugin = tmp_path / "plugin"
    info = plugin / "named_logs-1.0.dist-info"
    info.mkdir(parents=True)
    (plugin / "named_logs.py").write_text(LOGS_SPECS)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: named-logs\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[torchrun.logs_specs]\nnamed = named_logs:NamedLogsSpecs\n"
    )
    env = {"PYTHONPATH": os.pathsep.join([str(plugin), os.environ.get("PYTHONPATH", "")])}
    options = ["--standalone", "--nproc-per-node", "2", "--logs-specs"]
    theirs = _ran(tmp_path, "torchrun", _torchrun, [*options, "named"], env=env)
    mine = _ran(tmp_path, "unidist", _unidist, [*options, "named"], env=env)
    _assert_same_ranks(theirs, mine, 2)
    for ranks in (theirs, mine):
        assert [ranks[r]["env"].get("CHOSEN_BY") for r in (0, 1)] == ["named-logs"] * 2
    done, theirs = _run(tmp_path, "torchrun-missing", _torchrun, [*options, "nonesuch"], env=env)
    assert done.returncode != 0
    assert "torchrun.logs_specs[nonesuch]" in done.stderr
    assert theirs == {}
    done, mine = _run(tmp_path, "unidist-missing", _unidist, [*options, "nonesuch"], env=env)
    assert done.returncode == 2
    assert "--logs-specs 'nonesuch': no entry point of that name" in done.stderr
    assert mine == {}


#: torchrun's newer options: the option, a value (None: a flag), its PET_ variable's value.
NEWER = {
    "--signals-to-handle": ("SIGTERM,SIGUSR1", "SIGTERM,SIGUSR1"),
    "--event-log-handler": ("null", "null"),
    "--virtual-local-rank": (None, "1"),
}


def _given(option: str) -> list[str]:
    value = NEWER[option][0]
    return [option] if value is None else [option, value]


def _variable(option: str) -> str:
    """torchrun's ``PET_`` variable for ``option``."""
    return f"PET_{option[2:].replace('-', '_').upper()}"


def test_the_newer_torchrun_options_work_where_the_installed_torchrun_has_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each newer option, and its ``PET_`` variable, does what the installed torchrun does with
    it: applied where torchrun has it; else the option refused and the variable ignored. The
    options this torchrun has are given together (one launch each way), as are the variables."""
    base = ["--standalone", "--nproc-per-node", "2"]
    has = {option: _torchrun_has(option) for option in NEWER}
    applied = [arg for option in NEWER if has[option] for arg in _given(option)]
    if applied:
        theirs_done, theirs = _run(tmp_path, "torchrun", _torchrun, [*base, *applied])
        mine_done, mine = _run(tmp_path, "unidist", _unidist, [*base, *applied])
        assert theirs_done.returncode == 0, theirs_done.stderr[-3000:]
        assert mine_done.returncode == 0, mine_done.stderr[-3000:]
        _assert_same_ranks(theirs, mine, 2)
    script = str(_script(tmp_path))
    for option in (option for option in NEWER if not has[option]):
        out = tmp_path / f"refused{option}"
        out.mkdir()
        theirs_done = _torchrun(*base, *_given(option), script, str(out))
        assert theirs_done.returncode == 2, theirs_done.stderr[-3000:]
        assert f"unrecognized arguments: {option}" in theirs_done.stderr
        code, _, err = run_in_process(capsys, *base, *_given(option), script, str(out))
        assert code == 2, err
        assert "needs a newer torch" in err
        assert list(out.iterdir()) == []  # no rank of either ran
    # The variables: applied as the options where torchrun has them, else ignored by both.
    variables = {_variable(option): NEWER[option][1] for option in NEWER}
    theirs = _ran(tmp_path, "torchrun-variables", _torchrun, base, env=variables)
    mine = _ran(tmp_path, "unidist-variables", _unidist, base, env=variables)
    _assert_same_ranks(theirs, mine, 2)
    # unidist's note says so where it shows its plan.
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    code, planned, err = run_in_process(capsys, "--dry-run", *base, script, "out")
    assert code == 0, err
    for option in NEWER:
        ignored = f"{_variable(option)} is not read by this torch's torchrun"
        assert (ignored in planned) is not has[option], planned


def test_shutdown_timeout_is_taken_on_every_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--shutdown-timeout`` is unidist's ``--grace`` too: the same ranks as torchrun where
    torchrun has it; taken where the installed torchrun refuses it (torch 2.7), as the page
    says; its variable read where that torchrun reads it."""
    base = ["--standalone", "--nproc-per-node", "2"]
    mine = _ran(tmp_path, "unidist", _unidist, [*base, "--shutdown-timeout", "5"])
    theirs_done, theirs = _run(tmp_path, "torchrun", _torchrun, [*base, "--shutdown-timeout", "5"])
    if _torchrun_has("--shutdown-timeout"):
        assert theirs_done.returncode == 0, theirs_done.stderr[-3000:]
        _assert_same_ranks(theirs, mine, 2)
    else:
        assert theirs_done.returncode == 2
        assert "unrecognized arguments: --shutdown-timeout" in theirs_done.stderr
        assert sorted(mine) == [0, 1]
    script = str(_script(tmp_path))
    taken = ["--shutdown-timeout", "5"]
    code, _, err = run_in_process(capsys, "--dry-run", *base, *taken, script, "o")
    assert code == 0, err
    monkeypatch.setenv("PET_SHUTDOWN_TIMEOUT", "5")
    code, planned, err = run_in_process(capsys, "--dry-run", *base, script, "out")
    assert code == 0, err
    ignored = "PET_SHUTDOWN_TIMEOUT is not read by this torch's torchrun"
    assert (ignored in planned) is not _torchrun_has("--shutdown-timeout")


def test_numa_binding_does_what_the_installed_torchrun_does(tmp_path: Path) -> None:
    """Where torchrun has ``--numa-binding`` both hand it to torch's agent (which, without an
    accelerator, fails the same way); where it lacks it, both refuse it."""
    base = ["--standalone", "--nproc-per-node", "2", "--numa-binding", "node"]
    theirs_done, _ = _run(tmp_path, "torchrun", _torchrun, base)
    mine_done, _ = _run(tmp_path, "unidist", _unidist, base)
    if not _torchrun_has("--numa-binding"):
        assert theirs_done.returncode == mine_done.returncode == 2
        assert "unrecognized arguments: --numa-binding" in theirs_done.stderr
        assert "needs a newer torch" in mine_done.stderr
        return
    import torch

    if torch.cuda.is_available():
        assert theirs_done.returncode == mine_done.returncode == 0, mine_done.stderr[-3000:]
        return
    reason = "No accelerator available for NUMA binding"
    assert theirs_done.returncode != 0
    assert reason in theirs_done.stderr
    assert mine_done.returncode != 0
    assert reason in mine_done.stderr, mine_done.stderr[-3000:]


@pytest.mark.parametrize(
    ("option", "value", "hint"),
    [
        ("--duplicate-stdout-filters", "payload", "grep PATTERN"),
        ("--duplicate-stderr-filters", "payload", "grep PATTERN"),
        ("--print-completion", "bash", "no completion script"),
    ],
)
def test_torchrun_options_unidist_refuses_name_what_to_use(
    tmp_path: Path, option: str, value: str, hint: str
) -> None:
    """Options torchrun has (or, before torch 2.14, lacks) that unidist refuses, with the
    equivalent; their ``PET_`` variables, which torchrun runs with, are refused too."""
    from torch.distributed.run import get_args_parser

    script = str(_script(tmp_path))
    if not _torchrun_has(option):  # an older torchrun refuses it as unknown
        with pytest.raises(SystemExit) as exited:
            get_args_parser().parse_args([option, value, script])
        assert exited.value.code == 2
    elif option != "--print-completion":  # (that one prints a script and exits while parsing)
        parsed = get_args_parser().parse_args([option, value, script])
        assert getattr(parsed, option[2:].replace("-", "_")) == [value]
    done, mine = _run(tmp_path, "unidist", _unidist, ["-n", "2", option, value])
    assert done.returncode == 2
    assert f"{option} is torchrun's; unidist launch does not take it. HINT:" in done.stderr
    assert hint in done.stderr
    assert mine == {}
    if option == "--print-completion":
        return
    variable = {f"PET_{option[2:].replace('-', '_').upper()}": value}
    options = ["--standalone", "--nproc-per-node", "2"]
    theirs = _ran(tmp_path, "torchrun-variable", _torchrun, options, env=variable)
    assert sorted(theirs) == [0, 1]  # torchrun runs with it (filtering, or not reading it)
    done, mine = _run(tmp_path, "unidist-variable", _unidist, ["-n", "2"], env=variable)
    assert done.returncode == 2
    assert f"{next(iter(variable))} sets torchrun's {option}" in done.stderr
    assert mine == {}


def test_pet_variables_are_read_as_torchrun_reads_them(tmp_path: Path) -> None:
    """``PET_<OPTION>`` variables alone start the same job under both launchers."""
    variables = {
        "PET_NPROC_PER_NODE": "2",
        "PET_STANDALONE": "1",
        "PET_ROLE": "trainer",
        "PET_MAX_RESTARTS": "1",
    }
    theirs = _ran(tmp_path, "torchrun", _torchrun, [], env=variables)
    mine = _ran(tmp_path, "unidist", _unidist, [], env=variables)
    _assert_same_ranks_with_restarts(theirs, mine, 2)
    assert mine[1]["env"]["ROLE_NAME"] == "trainer"


def test_torchelastic_variables_are_read_as_torchrun_reads_them(tmp_path: Path) -> None:
    """Valid ``TORCHELASTIC_*`` values: the same file timer handed to the ranks and the same
    console prefix."""
    options = ["--standalone", "--nproc-per-node", "2", "-t", "3"]
    variables = {
        "TORCHELASTIC_ENABLE_FILE_TIMER": "1",
        "TORCHELASTIC_HEALTH_CHECK_PORT": str(free_port()),
        "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT": "600",
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": PREFIX,
    }
    seen = {}
    for label, launcher in (("torchrun", _torchrun), ("unidist", _unidist)):
        done, ranks = _run(tmp_path, label, launcher, options, env=variables)
        assert done.returncode == 0, done.stderr[-3000:]
        # The agent's file timer: its pipe's path is handed to the ranks.
        timer = [Path(r["env"]["TORCHELASTIC_TIMER_FILE"]).name[:15] for r in ranks.values()]
        seen[label] = (_payload_lines(done.stdout), timer)
    assert seen["unidist"] == seen["torchrun"]
    assert seen["torchrun"] == (
        ["<default:0> payload 0", "<default:1> payload 1"],
        ["watchdog_timer_"] * 2,
    )


@pytest.mark.parametrize(
    ("variables", "torch_runs", "says"),
    [
        ({"TORCHELASTIC_ENABLE_FILE_TIMER": "yes"}, True, "TORCHELASTIC_ENABLE_FILE_TIMER='yes'"),
        ({"TORCHELASTIC_HEALTH_CHECK_PORT": "99999"}, True, "TORCHELASTIC_HEALTH_CHECK_PORT="),
        (
            {"TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT": "10m"},
            True,
            "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT='10m' is not a number of seconds",
        ),
        (
            {"TORCHELASTIC_ENABLE_FILE_TIMER": "1", "TORCHELASTIC_TIMER_FILE": "/no/such/dir/t"},
            False,
            "TORCHELASTIC_TIMER_FILE='/no/such/dir/t': the folder '/no/such/dir' does not exist",
        ),
    ],
)
def test_a_variable_torch_would_ignore_or_fail_on_later_is_refused_first(
    tmp_path: Path, variables: dict[str, str], torch_runs: bool, says: str
) -> None:
    """A value torch's agent ignores (the job runs as if unset) or fails on inside the rendezvous
    is refused by unidist before anything starts, in one line naming the variable."""
    options = ["--standalone", "--nproc-per-node", "2"]
    done, theirs = _run(tmp_path, "torchrun", _torchrun, options, env=variables)
    if torch_runs:  # the value is ignored: the job runs as if it were not set
        assert done.returncode == 0, done.stderr[-3000:]
        assert sorted(theirs) == [0, 1]
        assert all("TORCHELASTIC_TIMER_FILE" not in r["env"] for r in theirs.values())
    else:  # torch's agent fails inside the rendezvous, with a bare FileNotFoundError
        assert done.returncode != 0
        assert "FileNotFoundError" in done.stderr
        assert theirs == {}
    done, mine = _run(tmp_path, "unidist", _unidist, ["-n", "2"], env=variables)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, done.stderr
    assert says in errors[0]
    assert mine == {}


# -- the backend and spawn ------------------------------------------------------------------------


def _visible_device() -> torch.device:
    """torch's own examples' choice: the current accelerator if one is available, else the CPU."""
    accelerator = torch.accelerator.current_accelerator()
    return accelerator if accelerator and torch.accelerator.is_available() else torch.device("cpu")


def _backends() -> tuple[str | None, str, str]:
    return (
        unidist.backend(),
        unidist.default_backend(),
        dist.get_default_backend_for_device(_visible_device()),
    )


@pytest.mark.parametrize("world", [1, 2])
def test_the_backend_is_torchs_default_for_the_visible_device(world: int) -> None:
    # torch >= 2.7 (the oldest unidist supports) has get_default_backend_for_device.
    """``unidist.default_backend`` and ``unidist.initialize()``'s choice against
    ``dist.get_default_backend_for_device`` for each device torch maps and the visible one."""
    for kind, backend in dist.Backend.default_device_backend_map.items():
        # xccl only in XPU builds; "fake" is torch's backend for its own tests (registered for
        # several devices once torch.testing's fake process group is imported, as another
        # test in this process may have done): it moves no data, and unidist never picks it.
        if dist.is_backend_available(backend) and backend != "fake":
            assert unidist.default_backend(kind) == dist.get_default_backend_for_device(kind)
    chosen = run_distributed(_backends, world_size=world, backend=None)
    expected = dist.get_default_backend_for_device(_visible_device())
    if world > 1:
        assert [ours for ours, _, _ in chosen] == [expected] * world  # initialize() picked it
    assert [(default, torchs) for _, default, torchs in chosen] == [(expected, expected)] * world


def spawned(local_rank: int, world: int, out: str, value: int) -> list[int]:
    """A function written for ``torch.multiprocessing.spawn``: it starts the group itself unless
    one is running (under unidist.spawn)."""
    started_here = not dist.is_initialized()
    if started_here:
        dist.init_process_group("gloo", rank=local_rank, world_size=world)
    total = torch.tensor([local_rank + value])
    dist.all_reduce(total)
    result = [local_rank, dist.get_rank(), dist.get_world_size(), int(total.item())]
    Path(out, f"{local_rank}.json").write_text(json.dumps(result))
    if started_here:
        if GLOO_TEARDOWN_DEADLOCK.present():
            # torch < 2.8's destroy can deadlock joining gloo's workers with the GIL held
            # (pytorch PR #154976), and a child left with an open group aborted at exit
            # (SIGABRT) once beside a busy machine: let the workers finish first, as
            # unidist.finalize does.
            gc.collect()
            time.sleep(0.1)
        dist.destroy_process_group()
    return result


def fails_on_rank_one(local_rank: int) -> None:
    if local_rank == 1:
        raise KeyError("missing shard")


def _written(folder: Path) -> list[list[int]]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


@pytest.mark.parametrize("nproc", [1, 2])
def test_spawn_runs_what_torch_multiprocessing_spawn_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nproc: int
) -> None:
    """The same function under ``torch.multiprocessing.spawn`` (MASTER_* set by hand) and
    ``unidist.spawn(..., pass_local_rank=True)``: the same ranks and collectives; unidist also
    returns every rank's result where torch returns None."""
    import torch.multiprocessing as mp

    theirs, mine = tmp_path / "torch", tmp_path / "unidist"
    theirs.mkdir()
    mine.mkdir()
    with monkeypatch.context() as patch:  # torch's call needs them set by hand
        patch.setenv("MASTER_ADDR", "127.0.0.1")
        patch.setenv("MASTER_PORT", str(free_port()))
        assert mp.spawn(spawned, args=(nproc, str(theirs), 10), nprocs=nproc) is None
    returned = unidist.spawn(
        spawned, nproc, str(mine), 10, nproc=nproc, pass_local_rank=True, console=False
    )
    total = sum(range(nproc)) + 10 * nproc
    expected = [[rank, rank, nproc, total] for rank in range(nproc)]
    assert _written(theirs) == _written(mine) == returned == expected


def test_spawn_names_the_rank_that_failed_as_torchs_does(tmp_path: Path) -> None:
    """Both name process 1 and its exception."""
    import torch.multiprocessing as mp

    with pytest.raises(mp.ProcessRaisedException) as theirs:
        mp.spawn(fails_on_rank_one, nprocs=2)
    assert theirs.value.error_index == 1
    assert "KeyError: 'missing shard'" in str(theirs.value)
    with pytest.raises(unidist.LaunchError) as mine:
        unidist.spawn(
            fails_on_rank_one, nproc=2, pass_local_rank=True, console=False, log_dir=tmp_path
        )
    assert mine.value.culprit == 1
    assert "KeyError: 'missing shard'" in str(mine.value)


# -- data and models ------------------------------------------------------------------------------

DATASET = list(range(23))
BATCH = 4
EPOCH_PLAN = [None, None, 3, None, 1]  # None: iterate again without set_epoch


def _sampler_passes(make: Callable[..., Any]) -> list[list[int]]:
    """Epoch 0 of the default sampler and of torch's positional arguments, then EPOCH_PLAN."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    passes = [list(make(DATASET)), list(make(DATASET, world, rank, False, 7, True))]
    sampler = make(DATASET, seed=5)
    for epoch in EPOCH_PLAN:
        if epoch is not None:
            sampler.set_epoch(epoch)
        passes.append(list(sampler))
    return passes


def _loader_epochs(loader: DataLoader[Any]) -> list[list[list[int]]]:
    epochs = []
    for epoch in range(3):
        loader.sampler.set_epoch(epoch)
        epochs.append([batch.tolist() for batch in loader])
    return epochs


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _full_state(model: nn.Module) -> dict[str, list[Any]]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {name: value.tolist() for name, value in state.items()}


def _step(model: nn.Module, grads: bool = True) -> dict[str, Any]:
    """One SGD step on this rank's part of a fixed batch: loss, gradients, weights after."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 4, generator=generator), torch.randn(8, 2, generator=generator)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = nn.functional.mse_loss(model(x.chunk(world)[rank]), y.chunk(world)[rank])
    loss.backward()
    seen = {"loss": loss.item()}
    if grads:
        seen["grads"] = [p.grad.tolist() for p in model.parameters() if p.grad is not None]
    optimizer.step()
    return {**seen, "weights": _full_state(model)}


def _ddp(model: nn.Module, **kwargs: Any) -> nn.Module:
    """torch's spelling: device_ids=[local_rank] on a GPU, none on the CPU (gloo)."""
    from torch.nn.parallel import DistributedDataParallel

    local = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        return DistributedDataParallel(model.to(local), device_ids=[local], **kwargs)
    return DistributedDataParallel(model, **kwargs)


def _torch_fsdp(model: nn.Module) -> nn.Module:
    from torch.distributed.fsdp import FullyShardedDataParallel

    # torch's FSDP v1 refuses the CPU unless it is named as the device.
    device = (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    )
    return FullyShardedDataParallel(model, device_id=torch.device(device))


def _torch_fully_shard(model: nn.Module) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def _module_of(model: nn.Module, kind: str) -> list[Any]:
    """Whether torch's ``.module`` (or unidist's ``unwrap_model``) gives the model back."""
    if kind == "torch":
        wrapped = _ddp(model)
        inner = [wrapped.module, torch.compile(wrapped)._orig_mod.module]
    else:
        wrapped = unidist.auto_model(model)
        inner = [unidist.unwrap_model(wrapped), unidist.unwrap_model(torch.compile(wrapped))]
    return [m is model for m in inner] + [sorted(inner[0].state_dict())]


def _fsdp_module_of(model: nn.Module, kind: str) -> bool:
    if kind == "torch":
        return _torch_fsdp(model).module is model
    return unidist.unwrap_model(unidist.auto_model(model, {"fsdp": {}})) is model


def _ddp_keywords(model: nn.Module, kind: str) -> list[Any]:
    keywords = {"find_unused_parameters": True, "gradient_as_bucket_view": True}
    wrapped = _ddp(model, **keywords) if kind == "torch" else unidist.auto_model(model, **keywords)
    names = ("find_unused_parameters", "gradient_as_bucket_view")
    return [type(wrapped).__name__, *(getattr(wrapped, name, None) for name in names)]


#: case -> (torch's call, unidist's call); each runs in a world of that side's starting.
MODEL_CASES: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
    "sampler": (
        lambda: _sampler_passes(DistributedSampler),
        lambda: _sampler_passes(unidist.DistributedSampler),
    ),
    "dataloader": (
        lambda: _loader_epochs(DataLoader(DATASET, BATCH, sampler=DistributedSampler(DATASET))),
        lambda: _loader_epochs(
            DataLoader(DATASET, BATCH, sampler=unidist.DistributedSampler(DATASET))
        ),
    ),
    "auto_dataloader": (
        lambda: _loader_epochs(DataLoader(DATASET, BATCH, sampler=DistributedSampler(DATASET))),
        lambda: _loader_epochs(unidist.auto_dataloader(DATASET, per_rank_batch_size=BATCH)),
    ),
    "auto_dataloader_batch_size": (
        lambda: len(DataLoader(DATASET, batch_size=BATCH, sampler=DistributedSampler(DATASET))),
        lambda: len(unidist.auto_dataloader(DATASET, batch_size=BATCH)),
    ),
    "ddp": (lambda: _step(_ddp(_model())), lambda: _step(unidist.auto_model(_model()))),
    "ddp_wrapper": (
        lambda: type(_ddp(_model())).__name__,
        lambda: type(unidist.auto_model(_model())).__name__,
    ),
    "ddp_keywords": (
        lambda: _ddp_keywords(_model(), "torch"),
        lambda: _ddp_keywords(_model(), "unidist"),
    ),
    # torch's DDP takes device_ids; auto_model sets it itself and refuses it (checked alone).
    "device_ids": (lambda: None, lambda: unidist.auto_model(_model(), device_ids=[0])),
    "module": (lambda: _module_of(_model(), "torch"), lambda: _module_of(_model(), "unidist")),
    "module_attribute": (
        lambda: type(_ddp(_model()).module).__name__,
        lambda: type(unidist.auto_model(_model()).module).__name__,
    ),
    "fsdp_module": (
        lambda: _fsdp_module_of(_model(), "torch"),
        lambda: _fsdp_module_of(_model(), "unidist"),
    ),
    "fsdp": (
        lambda: _step(_torch_fsdp(_model()), grads=False),
        lambda: _step(unidist.auto_model(_model(), {"fsdp": {}}), grads=False),
    ),
    "fsdp2": (
        lambda: _step(_torch_fully_shard(_model()), grads=False),
        lambda: _step(unidist.auto_model(_model(), {"fsdp2": {"wrap": ["Linear"]}}), grads=False),
    ),
}


def _outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        return ("ok", call())
    except Exception as exc:  # the error is the outcome compared
        return ("error", type(exc).__name__, str(exc))


def run_model_cases(starter: str) -> dict[str, tuple[Any, ...]]:
    """On every rank: start the world with ``starter``'s call, run that side of every case."""
    results = {}
    if starter == "torch":
        dist.init_process_group("gloo")
    else:
        # Before any process group: unidist's sampler reads the launcher's variables.
        results["sampler_before_group"] = _outcome(MODEL_CASES["sampler"][1])
        unidist.initialize("gloo")
    side = 0 if starter == "torch" else 1
    for name, pair in MODEL_CASES.items():
        results[name] = _outcome(pair[side])
    return results


Outcomes = dict[tuple[int, str], list[dict[str, tuple[Any, ...]]]]


@pytest.fixture(scope="module")
def outcomes() -> Outcomes:
    """Each (world size, starter)'s per-rank outcomes, run once for the module."""
    return {
        (world, starter): run_distributed(
            run_model_cases, starter, world_size=world, init=False, timeout=240
        )
        for world in (1, 2)
        for starter in ("torch", "unidist")
    }


def _same(outcomes: Outcomes, world: int, name: str, ours: str | None = None) -> None:
    """unidist's outcome of ``ours`` (default ``name``) is torch's of ``name``, rank by rank."""
    for rank in range(world):
        theirs = outcomes[world, "torch"][rank][name]
        mine = outcomes[world, "unidist"][rank][ours or name]
        assert theirs[0] == "ok", f"torch's own call failed on rank {rank}: {theirs}"
        assert mine == theirs, f"rank {rank} of {world}: torch gave {theirs}, unidist {mine}"


WORLDS = pytest.mark.parametrize("world", [1, 2])


@WORLDS
def test_distributed_sampler_gives_torchs_indices(outcomes: Outcomes, world: int) -> None:
    """Defaults from the process group (torch) or the launcher (unidist, before any group too);
    torch's positional arguments; epochs set and not set."""
    _same(outcomes, world, "sampler")
    _same(outcomes, world, "sampler", "sampler_before_group")
    passes = outcomes[world, "torch"][0]["sampler"][1]
    assert passes[2] == passes[3] != passes[4]  # without set_epoch the epoch repeats


@WORLDS
def test_set_epoch_gives_torchs_orders(outcomes: Outcomes, world: int) -> None:
    """Passes with and without ``set_epoch``, of the sampler and of a DataLoader over it."""
    _same(outcomes, world, "sampler")
    _same(outcomes, world, "dataloader")
    epochs = outcomes[world, "torch"][0]["dataloader"][1]
    assert epochs[0] != epochs[1]


@WORLDS
def test_a_dataloader_over_unidists_sampler_or_auto_dataloader_gives_torchs_batches(
    outcomes: Outcomes, world: int
) -> None:
    """Three epochs of batches; ``auto_dataloader(batch_size=)`` is refused, naming
    ``per_rank_batch_size``."""
    _same(outcomes, world, "dataloader")
    _same(outcomes, world, "auto_dataloader")
    for rank in range(world):
        refused = outcomes[world, "unidist"][rank]["auto_dataloader_batch_size"]
        assert refused[:2] == ("error", "ConfigurationError"), refused
        assert "per_rank_batch_size" in refused[2]


@WORLDS
def test_auto_model_trains_as_distributed_data_parallel(outcomes: Outcomes, world: int) -> None:
    """The same loss, gradients and weights after a step; DDP's keywords reach DDP; one process
    gets the model itself; ``device_ids`` is unidist's to set."""
    _same(outcomes, world, "ddp")
    wrapper = "DistributedDataParallel" if world > 1 else "Sequential"
    for rank in range(world):
        assert outcomes[world, "torch"][rank]["ddp_wrapper"] == ("ok", "DistributedDataParallel")
        assert outcomes[world, "unidist"][rank]["ddp_wrapper"] == ("ok", wrapper)
        refused = outcomes[world, "unidist"][rank]["device_ids"]
        assert refused[:2] == ("error", "ConfigurationError"), refused
        assert "unidist sets DDP's device_ids" in refused[2]
    if world > 1:
        _same(outcomes, world, "ddp_keywords")


@WORLDS
def test_unwrap_model_gives_what_module_gives(outcomes: Outcomes, world: int) -> None:
    """DDP's ``.module`` (also under ``torch.compile``) and FSDP v1's, against unwrap_model;
    in one process unidist's model has no ``.module``, as the page warns."""
    _same(outcomes, world, "module")
    _same(outcomes, world, "fsdp_module")
    for rank in range(world):
        assert outcomes[world, "torch"][rank]["module"][1][:2] == [True, True]
        if world > 1:
            _same(outcomes, world, "module_attribute")
        else:
            got = outcomes[world, "unidist"][rank]["module_attribute"]
            assert got[:2] == ("error", "AttributeError"), got


@WORLDS
def test_auto_model_shards_as_fsdp_and_fully_shard(outcomes: Outcomes, world: int) -> None:
    """The same loss and full weights after a step as ``FullyShardedDataParallel(model)`` and
    as ``fully_shard`` on each Linear and the model."""
    _same(outcomes, world, "fsdp")
    if world == 1 or not GLOO_AVG_SUMS.present():
        _same(outcomes, world, "fsdp2")
        return
    # This torch's gloo sums what fully_shard averages (pytorch#162338), so torch's own FSDP2
    # update is world-size times too large; unidist corrects it: DDP's average is the reference.
    for rank in range(world):
        theirs = outcomes[world, "torch"][rank]["fsdp2"][1]
        mine = outcomes[world, "unidist"][rank]["fsdp2"][1]
        averaged = outcomes[world, "torch"][rank]["ddp"][1]
        assert mine["loss"] == theirs["loss"] == averaged["loss"]
        for name, weights in averaged["weights"].items():
            assert torch.allclose(torch.tensor(mine["weights"][name]), torch.tensor(weights))
            assert not torch.allclose(torch.tensor(theirs["weights"][name]), torch.tensor(weights))
