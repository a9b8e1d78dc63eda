"""torchrun's options and variables at their edges: one line that names each, before anything
starts; what another program chose (a folder name, an id) is printed escaped.

The values are those a user or a scheduler really sets by mistake: a 100 kB id read from a file,
a newline from a variable, an escape sequence in a folder name, ``yes`` for a flag torch reads
as ``1``, a port out of range, a timer file in a folder that does not exist.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.launch.helpers import JOB, launch, run_folder, run_in_process
from unidist.cli import main
from unidist.launch.plan.rendezvous import keep_alive
from unidist.launch.printing import shown

ESCAPE = "\x1b]0;retitled\x07"  # what would retitle the terminal if printed raw


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    return run_in_process(capsys, *args)


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("unidist launch: error: "), err
    assert "\x1b" not in err
    assert "\x07" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--rdzv-id", "x" * 100_000], "--rdzv-id 'xxxx"),
        (["--rdzv-id", "job\n"], "--rdzv-id 'job\\n' contains a control character"),
        (["--rdzv-id", f"a{ESCAPE}"], "--rdzv-id 'a\\x1b]0;retitled\\x07' contains a control"),
        (["--role", "trainer\r"], "--role 'trainer\\r' contains a control character"),
        (["--signals-to-handle", "SIGTERM,SIGFOO"], "'SIGFOO' is not a signal name"),
        (["--rdzv-conf", "join_timeout=1.5"], "join_timeout='1.5' is not a whole number"),
        (["--rdzv-conf", "last_call_timeout=0"], "last_call_timeout='0' must be 1 or more"),
        (["--rdzv-conf", "is_host=maybe"], "is_host='maybe' is not a boolean"),
        (["--rdzv-conf", "store_type=redis"], "store_type='redis' is not a store type"),
        (["--node-timeout", "0.5"], "--node-timeout must be a number of seconds of at least 1"),
        (["--log-dir", "/tmp/" + "d" * 300], "is longer than the file system takes"),
    ],
)
def test_an_option_at_its_edge_gets_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    code, _, err = run(capsys, "--dry-run", *args, JOB)
    assert code == 2
    assert says in _one_line(err)


def test_a_long_id_is_cut_in_the_message(capsys: pytest.CaptureFixture[str]) -> None:
    _, _, err = run(capsys, "--dry-run", "--rdzv-id", "x" * 100_000, JOB)
    line = _one_line(err)
    assert "(100000 characters) is longer than 1024 characters" in line
    assert len(line) < 400


@pytest.mark.parametrize(
    ("variables", "says"),
    [
        ({"TORCHELASTIC_ENABLE_FILE_TIMER": "yes"}, "TORCHELASTIC_ENABLE_FILE_TIMER='yes'"),
        (
            {"TORCHELASTIC_ENABLE_FILE_TIMER": "1", "TORCHELASTIC_TIMER_FILE": "/no/such/dir/t"},
            "TORCHELASTIC_TIMER_FILE='/no/such/dir/t': the folder '/no/such/dir' does not exist",
        ),
        ({"TORCHELASTIC_HEALTH_CHECK_PORT": "99999"}, "TORCHELASTIC_HEALTH_CHECK_PORT='99999'"),
        ({"TORCHELASTIC_HEALTH_CHECK_PORT": "http"}, "is not a port from 0 to 65535"),
        (
            {"TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT": "10m"},
            "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT='10m' is not a number of seconds",
        ),
        ({"PET_MAX_RESTARTS": "three"}, "PET_MAX_RESTARTS='three' is not a whole number"),
        ({"PET_MASTER_PORT": "http"}, "PET_MASTER_PORT='http' is not a port number"),
        ({"PET_MONITOR_INTERVAL": "fast"}, "PET_MONITOR_INTERVAL='fast' is not a number"),
        ({"PET_RDZV_ID": "y" * 5000}, "PET_RDZV_ID 'yyyy"),
        ({"PET_SIGNALS_TO_HANDLE": "SIGX"}, "PET_SIGNALS_TO_HANDLE 'SIGX': 'SIGX' is not a signal"),
        ({"PET_DUPLICATE_STDOUT_FILTERS": "loss"}, "PET_DUPLICATE_STDOUT_FILTERS sets torchrun's"),
    ],
)
def test_a_variable_at_its_edge_gets_one_line_naming_it(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    variables: dict[str, str],
    says: str,
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    code, _, err = run(capsys, "--dry-run", JOB)
    assert code == 2
    assert says in _one_line(err)


def test_a_variable_the_command_line_replaces_is_not_read(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # As under torchrun: argparse reads a PET_ default only when the option is not given.
    monkeypatch.setenv("PET_MAX_RESTARTS", "three")
    code, out, err = run(capsys, "--dry-run", "--max-restarts", "2", JOB)
    assert code == 0, err
    assert "restarts       2" in out


def test_agent_variables_torch_reads_as_set_pass(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TORCHELASTIC_ENABLE_FILE_TIMER", "1")
    monkeypatch.setenv("TORCHELASTIC_TIMER_FILE", str(tmp_path / "timer"))
    monkeypatch.setenv("TORCHELASTIC_HEALTH_CHECK_PORT", "8080")
    monkeypatch.setenv("TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT", "0")
    code, out, err = run(capsys, "--dry-run", JOB)
    assert code == 0, err
    assert "Equivalent commands:" in out


def test_a_newer_pet_variable_is_read_where_this_torch_reads_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    from torch.distributed.launcher.api import LaunchConfig

    monkeypatch.setenv("PET_SIGNALS_TO_HANDLE", "SIGTERM,SIGUSR1")
    code, out, err = run(capsys, "--dry-run", JOB)
    assert code == 0, err
    has = "signals_to_handle" in {f.name for f in dataclasses.fields(LaunchConfig)}
    # torch 2.7's torchrun neither has the option nor reads the variable: ignored, and said.
    assert ("PET_SIGNALS_TO_HANDLE is not read by this torch's torchrun" in out) is not has
    code, _, err = run(capsys, "--dry-run", "--signals-to-handle", "SIGTERM", JOB)
    assert (code, "needs a newer torch" in err) == ((0, False) if has else (2, True))


def test_the_node_timeout_becomes_whole_seconds_torch_reads() -> None:
    # torch reads keep_alive_interval with int(): "3.33333" failed every rendezvous.
    assert keep_alive(6) == (2, 3)
    assert keep_alive(10) == (3, 3)
    assert keep_alive(1) == (1, 1)
    assert keep_alive(2) == (1, 2)
    assert keep_alive(60) == (20, 3)
    for seconds in (1, 1.4, 2.5, 7, 11, 100, 3600):
        interval, attempts = keep_alive(seconds)
        assert interval >= 1
        assert attempts >= 1
        assert abs(interval * attempts - seconds) <= max(1.5, seconds * 0.25)


def test_paths_are_printed_escaped() -> None:
    assert shown("/tmp/logs/rank0.log") == "/tmp/logs/rank0.log"
    assert shown(f"/tmp/{ESCAPE}/r") == "'/tmp/\\x1b]0;retitled\\x07/r'"
    assert shown(Path("/tmp/a\nb")) == "'/tmp/a\\nb'"


@pytest.mark.multiprocess
def test_a_failure_report_prints_a_folder_name_escaped(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text("import sys\nsys.exit(3)\n")
    logs = tmp_path / f"logs{ESCAPE}"
    done = launch("-n", "1", "--log-dir", str(logs), str(script))
    assert done.returncode == 3
    assert "\x1b" not in done.stderr + done.stdout
    assert "\x07" not in done.stderr + done.stdout
    folder = run_folder(logs)
    assert f"full logs: {shown(folder / 'rank0.stderr.log')}" in done.stderr


# -- an exception of torch's agent before any rank starts ---------------------------------------


class AgentBroke(Exception):
    """What a faulty agent plugin raises (torch's own test mocks the agent the same way)."""


def test_an_agent_error_before_any_rank_is_named_not_called_a_rendezvous_failure(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    def broken(self: object, *args: object, **kwargs: object) -> None:
        raise AgentBroke("the plugin could not open its socket")

    monkeypatch.setattr(LocalElasticAgent, "run", broken)
    code = main(["launch", "--standalone", "-n", "1", str(JOB)])
    err = capsys.readouterr().err
    assert code == 1
    assert "torch's elastic agent raised AgentBroke: the plugin could not open its socket" in err
    assert "in broken before starting any rank" in err
    assert "did not complete" not in err


def test_a_rendezvous_timeout_before_any_rank_is_still_a_rendezvous_failure(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError

    def times_out(self: object, *args: object, **kwargs: object) -> None:
        raise RendezvousTimeoutError("no other node came")

    monkeypatch.setattr(LocalElasticAgent, "run", times_out)
    code = main(["launch", "--standalone", "-n", "1", str(JOB)])
    err = capsys.readouterr().err
    assert code == 1
    assert "rendezvous at" in err
    assert "did not complete: RendezvousTimeoutError: no other node came" in err
