"""``unidist launch`` gives the ranks torchrun's contract: its variables with torchrun's meaning,
the agent's store at MASTER_ADDR:MASTER_PORT, torch's error files, ``PET_*`` options, the
log-line prefix variable and ``--logs-specs``. Compared with torchrun itself where that is cheap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.launch.helpers import LOGS_SPECS, free_port, launch, on_a_free_port, run_folder

pytestmark = pytest.mark.multiprocess

#: Every variable torchrun's agent gives a rank (torch 2.7 on), and OMP_NUM_THREADS (nproc > 1).
TORCHRUN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
)
#: Values that differ from run to run, under torchrun as well.
PER_RUN = ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE")

DUMP = """
import json, os, sys
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as out:
    json.dump(dict(os.environ), out)
"""


def _clean_env() -> dict[str, str]:
    """This process's environment without what would change either launcher's choices."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    env.pop("OMP_NUM_THREADS", None)
    env.pop("TORCH_NCCL_ASYNC_ERROR_HANDLING", None)
    return env


def _torchrun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env=_clean_env(),
    )


def _dumps(folder: Path) -> dict[int, dict[str, str]]:
    return {int(p.stem): json.loads(p.read_text()) for p in folder.glob("*.json")}


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_the_ranks_get_torchruns_variables_with_its_values(tmp_path: Path) -> None:
    script = _script(tmp_path, "dump.py", DUMP)
    (tmp_path / "torchrun").mkdir()
    (tmp_path / "unidist").mkdir()
    done = _torchrun("--standalone", "--nproc-per-node", "2", str(script), "torchrun", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ours = launch("-n", "2", str(script), str(tmp_path / "unidist"), env=_clean_env())
    assert ours.returncode == 0, ours.stderr
    theirs, mine = _dumps(tmp_path / "torchrun"), _dumps(tmp_path / "unidist")
    assert sorted(theirs) == sorted(mine) == [0, 1]
    for rank in (0, 1):
        for name in TORCHRUN_VARIABLES:
            assert name in theirs[rank], name  # the list above is torchrun's
            assert name in mine[rank], f"rank {rank} lacks {name}"
            if name not in PER_RUN:
                assert mine[rank][name] == theirs[rank][name], name
        assert Path(mine[rank]["TORCHELASTIC_ERROR_FILE"]).name == f"error-s0-r{rank}.json"
    assert mine[0]["MASTER_PORT"] == mine[1]["MASTER_PORT"]


INIT_TCP = """
import os, sys
import torch
import torch.distributed as dist
port = sys.argv[1]
assert os.environ["MASTER_PORT"] == port, os.environ["MASTER_PORT"]
assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True"
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method=f"tcp://localhost:{port}", rank=rank, world_size=world)
total = torch.ones(1)
dist.all_reduce(total)
print(f"rank {rank} total {total.item()}")
dist.destroy_process_group()
"""


def test_master_port_on_one_node_is_the_agents_store(tmp_path: Path) -> None:
    """As under torchrun: init_method="tcp://localhost:P" reaches the agent's store at P."""
    script = _script(tmp_path, "init_tcp.py", INIT_TCP)
    _, done = on_a_free_port(
        lambda port: launch("-n", "2", "--master-port", port, str(script), port)
    )
    assert done.returncode == 0, done.stderr
    assert "rank 1 total 2.0" in done.stdout


def test_master_port_from_torchrun_gives_the_same_master_addr(tmp_path: Path) -> None:
    script = _script(tmp_path, "dump.py", DUMP)
    (tmp_path / "torchrun").mkdir()
    (tmp_path / "unidist").mkdir()
    _, done = on_a_free_port(
        lambda port: _torchrun(
            "--nproc-per-node", "2", "--master-port", port, str(script), "torchrun", cwd=tmp_path
        )
    )
    assert done.returncode == 0, done.stderr
    port, ours = on_a_free_port(
        lambda port: launch(
            "-n", "2", "--master-port", port, str(script), str(tmp_path / "unidist")
        )
    )
    assert ours.returncode == 0, ours.stderr
    theirs, mine = _dumps(tmp_path / "torchrun")[1], _dumps(tmp_path / "unidist")[1]
    assert (mine["MASTER_ADDR"], mine["MASTER_PORT"]) == (theirs["MASTER_ADDR"], port)
    assert mine["TORCHELASTIC_USE_AGENT_STORE"] == theirs["TORCHELASTIC_USE_AGENT_STORE"] == "True"


RECORDED = """
import os, sys
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    if os.environ["RANK"] == "1":
        raise ValueError("bad learning rate " + sys.argv[1])

main()
"""


def test_the_error_file_is_torchs_and_names_the_culprit(tmp_path: Path) -> None:
    script = _script(tmp_path, "recorded.py", RECORDED)
    done = launch("-n", "2", "--log-dir", str(tmp_path / "logs"), str(script), "0.5")
    assert done.returncode == 1
    assert "culprit: rank 1 (local rank 1)" in done.stderr
    assert "raised ValueError: bad learning rate 0.5" in done.stderr
    error_file = run_folder(tmp_path / "logs") / ".events" / "error-s0-r1.json"
    data = json.loads(error_file.read_text())
    assert data["message"]["message"] == "ValueError: bad learning rate 0.5"
    assert "py_callstack" in data["message"]["extraInfo"]
    assert data["message"]["extraInfo"]["unidist"]["kind"] == "raised"
    assert not list(error_file.parent.glob("*torch-error*"))  # one record, not two

    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    failure = ProcessFailure(local_rank=1, pid=1, exitcode=1, error_file=str(error_file))
    assert failure.message["message"] == "ValueError: bad learning rate 0.5"  # torch's reading
    assert failure.timestamp == int(data["message"]["extraInfo"]["timestamp"])


TORCH_ONLY = """
import os
from torch.distributed.elastic.multiprocessing.errors import get_error_handler

if os.environ["RANK"] == "0":
    try:
        raise KeyError("missing shard 7")
    except KeyError as exc:
        get_error_handler().record_exception(exc)  # torch's writer, no unidist wrapper
    os._exit(3)
"""


def test_an_error_file_torch_wrote_alone_is_read(tmp_path: Path) -> None:
    """A rank that leaves without unidist's wrapper seeing the exception (os._exit after
    torch's handler wrote the file) is still named with its exception."""
    script = _script(tmp_path, "torch_only.py", TORCH_ONLY)
    done = launch("-n", "2", str(script))
    assert done.returncode == 3, done.stderr
    assert "culprit: rank 0 (local rank 0)" in done.stderr
    assert "KeyError: 'missing shard 7'" in done.stderr


def test_pet_variables_set_torchruns_options(tmp_path: Path) -> None:
    port = str(free_port())
    env = {"PET_NPROC_PER_NODE": "3", "PET_MASTER_PORT": port, "PET_MAX_RESTARTS": "2"}
    script = _script(tmp_path, "job.py", "")
    done = launch("--dry-run", str(script), env=env)
    assert done.returncode == 0, done.stderr
    assert "3 on this node" in done.stdout
    assert f"static at 127.0.0.1:{port}" in done.stdout
    assert "restarts       2" in done.stdout


def test_the_command_line_wins_over_pet_variables(tmp_path: Path) -> None:
    script = _script(tmp_path, "job.py", "")
    env = {"PET_NPROC_PER_NODE": "3", "PET_MAX_RESTARTS": "2"}
    done = launch("--dry-run", "-n", "2", "--max-restarts", "1", str(script), env=env)
    assert done.returncode == 0, done.stderr
    assert "2 on this node" in done.stdout
    assert "restarts       1" in done.stdout


def test_pet_flags_are_zero_or_one(tmp_path: Path) -> None:
    script = _script(tmp_path, "job.py", "")
    done = launch("--dry-run", str(script), env={"PET_MODULE": "1", "PET_NO_PYTHON": "1"})
    assert done.returncode == 2
    assert "-m and --no-python contradict each other" in done.stderr
    done = launch("--dry-run", str(script), env={"PET_STANDALONE": "yes"})
    assert done.returncode == 2
    assert "PET_STANDALONE='yes': torchrun reads a flag's PET_ variable as 0 or 1" in done.stderr
    done = launch("--dry-run", str(script), env={"PET_MODULE": "0"})
    assert done.returncode == 0, done.stderr


def test_the_log_line_prefix_variable(tmp_path: Path) -> None:
    script = _script(tmp_path, "hello.py", "import os\nprint('hello from', os.environ['RANK'])\n")
    env = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "<${role_name}:${rank}> "}
    done = launch("-n", "2", str(script), env=env)
    assert done.returncode == 0, done.stderr
    assert "<default:1> hello from 1" in done.stdout
    done = launch("-n", "2", "--log-line-prefix-template", "R${rank}| ", str(script), env=env)
    assert "R1| hello from 1" in done.stdout


def test_logs_specs_takes_torchruns_entry_points(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "named_logs.py").write_text(LOGS_SPECS)
    info = plugin / "named_logs-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: named-logs\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[torchrun.logs_specs]\nnamed = named_logs:NamedLogsSpecs\n"
    )
    script = _script(
        tmp_path, "hello.py", "import os\nprint('chosen by', os.environ.get('CHOSEN_BY'))\n"
    )
    path = os.pathsep.join([str(plugin), os.environ.get("PYTHONPATH", "")])
    logs = tmp_path / "logs"
    done = launch(
        "-n", "2", "--logs-specs", "named", "--log-dir", str(logs), "--redirects", "3",
        "--console-ranks", "none", str(script), env={"PYTHONPATH": path},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    written = sorted(logs.rglob("stdout.log"))
    assert len(written) == 2, list(logs.rglob("*"))
    assert "chosen by named-logs" in written[0].read_text()
    missing = launch("-n", "2", "--logs-specs", "nonesuch", str(script), env={"PYTHONPATH": path})
    assert missing.returncode == 2
    assert "--logs-specs 'nonesuch': no entry point of that name" in missing.stderr
    assert "named" in missing.stderr


def test_rdzv_conf_quoted_twice_is_read_as_meant() -> None:
    """torchrun's own tests pass ``--rdzv-conf='a=1,b=2'`` with the quotes inside the value."""
    from unidist.launch.plan.rendezvous import parse_conf

    conf = "'join_timeout=5,last_call_timeout=1,timeout=5'"
    expected = {"join_timeout": "5", "last_call_timeout": "1", "timeout": "5"}
    assert parse_conf(conf, "c10d") == expected
    assert parse_conf(conf.replace("'", '"'), "c10d") == expected


def test_a_number_from_its_pet_variable_is_known_to_come_from_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # argparse converts the variable's text with the option's type (7.0 from "7"): it still
    # counts as the variable's, so an option this torch's torchrun lacks ignores it, as torchrun.
    from unidist.compat.torchrun import parse_args
    from unidist.launch.plan.options import from_variable

    monkeypatch.setenv("PET_SHUTDOWN_TIMEOUT", "7")
    monkeypatch.setenv("PET_MAX_RESTARTS", "2")
    args = parse_args(["job.py"])
    assert (args.shutdown_timeout, args.max_restarts) == (7.0, 2)
    assert from_variable(args, "shutdown_timeout")
    assert from_variable(args, "max_restarts")
    given = parse_args(["--shutdown-timeout", "9", "job.py"])
    assert not from_variable(given, "shutdown_timeout")
