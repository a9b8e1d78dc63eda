"""What the launcher says when torch's agent or its rendezvous fails, instead of torch's traceback.

Before any rank started, the rendezvous (or a plugin of torch's agent) failed: one
:class:`~unidist.errors.LaunchError` says which, where and why. After the ranks ran, the store of
the rendezvous went away (its host's launcher left): another says so, and what to do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unidist.errors import LaunchError

if TYPE_CHECKING:
    from unidist.launch.plan.job import LaunchPlan
    from unidist.launch.supervise.runner import Run

__all__ = ["raise_rendezvous_error"]


def _rendezvous_failed(plan: LaunchPlan, exc: BaseException) -> str:
    rdzv = plan.rdzv
    return (
        f"unidist launch: the {rdzv.backend} rendezvous at {rdzv.endpoint} (id {rdzv.run_id!r}, "
        f"{rdzv.nnodes} node(s)) did not complete: {type(exc).__name__}: {exc}\n"
        "HINT: every node must run unidist launch with the same --rdzv-endpoint, --rdzv-id and "
        "--nnodes, and HOST:PORT must be reachable from every node; the rendezvous waits "
        "join_timeout seconds (--rdzv-conf join_timeout=600) for the others.\n"
    )


def _from_rendezvous(exc: BaseException) -> bool:
    """Whether ``exc`` is the rendezvous's (torch's rendezvous and store errors, timeouts)."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    rendezvous = (RendezvousError, dist.DistError, TimeoutError, ConnectionError)
    return isinstance(exc, rendezvous) or isinstance(exc.__cause__, rendezvous)


def _agent_failed(plan: LaunchPlan, exc: BaseException) -> str:
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
    return (
        f"unidist launch: torch's elastic agent raised {type(exc).__name__}: {exc}{where} "
        f"before starting any rank (after the {plan.rdzv.backend} rendezvous began at "
        f"{plan.rdzv.endpoint}; not a rendezvous error).\n"
        "HINT: the traceback's last frame says which part of the agent failed; a rendezvous "
        "or agent plugin (--rdzv-backend, --logs-specs) is the usual cause.\n"
    )


def raise_rendezvous_error(job: Run, exc: BaseException) -> None:
    """A LaunchError in place of ``exc`` when the rendezvous is what failed (else nothing)."""
    if job.current is None or _store_lost(exc):
        # The message says what ``exc`` said; its frames would keep torch's agent and the
        # rendezvous store it hosts (a TCPStore and its server thread) alive for as long as
        # a caller in Python keeps the LaunchError, and a process forked meanwhile would
        # abort when it collects them ("terminate called ... std::system_error").
        import traceback

        traceback.clear_frames(exc.__traceback__)
    if job.current is None:
        # Nothing started: the rendezvous failed, or something else in torch's agent's set-up
        # (a plugin, a file, a bug) did; say which, where and why.
        if _from_rendezvous(exc):
            raise LaunchError(
                _rendezvous_failed(job.plan, exc), exit_code=1, culprit=None
            ) from None
        # The agent's own exception stays the cause (its frames cleared above), so that code
        # that drives the launcher from Python (unidist.compat.torchrun) can raise it as
        # torchrun does.
        raise LaunchError(_agent_failed(job.plan, exc), exit_code=1, culprit=None) from exc
    if _store_lost(exc):
        # The ranks ran; then the rendezvous store went away (its host left): torch's agent
        # stopped this node's ranks and raised from its next look at the store.
        raise LaunchError(_rendezvous_lost(job, exc), exit_code=1, culprit=None) from None


def _store_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (from torch's agent, after the ranks started) says the rendezvous store
    cannot be reached: torch wraps the store's network error in RendezvousConnectionError."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    return isinstance(exc, RendezvousConnectionError | dist.DistNetworkError)


def _rendezvous_lost(job: Run, exc: BaseException) -> str:
    rdzv = job.plan.rdzv
    starts = len(job.starts)
    cause = exc.__cause__ or exc.__context__
    first = str(exc).split("\n", 1)[0].replace(" See inner exception for details.", "")
    if cause is not None:
        first += f" ({type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''})"
    first = first[:400]
    return (
        f"unidist launch: lost the {rdzv.backend} rendezvous store at {rdzv.endpoint} (id "
        f"{rdzv.run_id!r}) after {starts} start(s) of this node's ranks: "
        f"{type(exc).__name__}: {first} The store lives in the launcher that hosts it (the one "
        "on the --rdzv-endpoint host): it left or stopped answering, and torch's agents cannot "
        "go on without it, so this node's ranks were stopped.\n"
        "HINT: keep the node that hosts the store for the whole job, or host the store on a "
        "machine that stays (see 'Limits' in the elastic training guide); then start this "
        "launcher again: with unidist.ResumableState the job resumes from its last "
        "checkpoint.\n"
    )
