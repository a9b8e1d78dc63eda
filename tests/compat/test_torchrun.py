"""unidist.compat.torchrun: torchrun's Python entry points, raising torchrun's exception types."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.launch.helpers import JOB
from unidist.compat import torchrun


def test_an_option_torchrun_refuses_after_parsing_is_its_value_error() -> None:
    # torchrun's main raises ValueError for --no-python with --module (config_from_args).
    with pytest.raises(ValueError, match="-m and --no-python contradict each other"):
        torchrun.main(["--no-python", "-m", "--nproc-per-node", "1", JOB, "ok"])
    with pytest.raises(ValueError, match="Unsupported nproc_per_node value"):
        torchrun.main(["--nproc-per-node", "unknown", JOB, "ok"])


def test_argparses_own_errors_exit_2_as_torchruns_do() -> None:
    with pytest.raises(SystemExit) as exited:
        torchrun.main(["--no-such-option", JOB])
    assert exited.value.code == 2


@pytest.mark.multiprocess
def test_a_job_whose_rank_fails_raises_child_failed_error_naming_it(tmp_path: Path) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = ["--standalone", "--nproc-per-node", "2", "--log-dir", str(tmp_path), JOB, "exit7"]
    with pytest.raises(ChildFailedError) as failed:
        torchrun.main(args)
    codes = {rank: f.exitcode for rank, f in failed.value.failures.items()}
    assert 7 in codes.values(), codes


@pytest.mark.multiprocess
def test_a_job_that_succeeds_returns_none(tmp_path: Path) -> None:
    args = ["--standalone", "--nproc-per-node", "2", "--log-dir", str(tmp_path), JOB, "ok"]
    assert torchrun.main(args) is None


class AgentBroke(Exception):
    pass


def test_an_agent_error_is_re_raised_as_torchrun_does_without_keeping_the_store_alive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torchrun re-raises what its agent raised (torch's test_run.py checks it with a mock
    # of LocalElasticAgent.run). A caller that keeps the error must not keep torch's agent and
    # its TCPStore (with its server thread) alive: a process forked meanwhile aborted when it
    # collected them.
    import torch.distributed as dist
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.rendezvous.api import RendezvousHandler

    from unidist import LaunchError

    def broken(self: object, *args: object, **kwargs: object) -> None:
        raise AgentBroke("the agent broke")

    monkeypatch.setattr(LocalElasticAgent, "run", broken)
    with pytest.raises(AgentBroke, match="the agent broke") as raised:
        torchrun.main(["--standalone", "--nproc-per-node", "1", JOB, "ok"])
    report = raised.value.__context__
    assert isinstance(report, LaunchError)
    assert "torch's elastic agent raised AgentBroke: the agent broke" in report.report
    kept = []
    tb = raised.value.__traceback__
    while tb is not None:
        kept += [
            name
            for name, value in tb.tb_frame.f_locals.items()
            if isinstance(value, dist.Store | RendezvousHandler | LocalElasticAgent)
        ]
        tb = tb.tb_next
    assert kept == []
