"""``unidist launch --dry-run``: the resolved topology and the equivalent commands of the peers."""

from __future__ import annotations

import shlex

from unidist.launch.plan.job import LaunchPlan
from unidist.launch.plan.rundir import RUN_NAME_HINT, default_root
from unidist.launch.printing import shown

__all__ = ["describe", "log_templates"]


def log_templates(plan: LaunchPlan) -> tuple[str, str]:
    """The log file templates a real run of ``plan`` uses, with its new folder as ``<run>``."""
    root = plan.log_root if plan.log_root is not None else default_root()
    return plan.templates(root / RUN_NAME_HINT)


def describe(plan: LaunchPlan) -> str:
    """What the launch would do, and how torchrun, Composer and Ignite would say it."""
    target = ["-m", str(plan.target)] if plan.module else [str(plan.target)]
    script = shlex.join([*target, *plan.args])
    rdzv = plan.rdzv
    stdout, stderr = log_templates(plan)
    lines = [
        "unidist launch --dry-run (nothing was started)",
        f"  nodes          {_nodes(plan)}",
        f"  processes      {plan.nproc} on this node, {_world(plan)} in all",
        f"  global ranks   {_ranks(plan)}",
        f"  rendezvous     {rdzv.describe()}",
        f"  logs           {shown(stdout)}",
        f"                 {shown(stderr)}",
        f"                 {RUN_NAME_HINT}: a new private folder per run, named like "
        "20260131-154138-8d22a5",
        f"  restarts       {plan.max_restarts}",
        *(f"  note           {note}" for note in plan.notes),
        "",
        "Equivalent commands:",
        f"  torchrun  {_torchrun(plan, script)}",
        f"  composer  {_composer(plan, script)}",
        "  ignite    (in Python, no CLI)",
        *(f"            {line}" for line in _ignite(plan)),
    ]
    return "\n".join(lines) + "\n"


def _nodes(plan: LaunchPlan) -> str:
    rdzv = plan.rdzv
    if rdzv.node_rank is None:
        return f"{rdzv.nnodes} (this node's rank is assigned by the rendezvous)"
    return f"{rdzv.min_nodes} (this is node {rdzv.node_rank})"


def _world(plan: LaunchPlan) -> str:
    low, high = plan.rdzv.min_nodes * plan.nproc, plan.rdzv.max_nodes * plan.nproc
    return str(low) if low == high else f"{low} to {high}"


def _ranks(plan: LaunchPlan) -> str:
    node = plan.rdzv.node_rank
    if node is None:
        return "assigned at the rendezvous"
    return f"{node * plan.nproc}..{(node + 1) * plan.nproc - 1} on this node"


def _torchrun(plan: LaunchPlan, script: str) -> str:
    rdzv = plan.rdzv
    nproc = f"--nproc-per-node {plan.nproc}"
    if rdzv.backend == "static":
        host, port = rdzv.host, rdzv.port
        return (
            f"torchrun --nnodes {rdzv.nnodes} --node-rank {rdzv.node_rank} {nproc} "
            f"--master-addr {host} --master-port {port} {script}"
        )
    if rdzv.max_nodes == 1 and rdzv.endpoint.endswith(":0"):
        return f"torchrun --standalone {nproc} {script}"
    conf = ",".join(f"{k}={v}" for k, v in rdzv.configs.items())
    return (
        f"torchrun --nnodes {rdzv.nnodes} {nproc} --rdzv-backend {rdzv.backend} "
        f"--rdzv-endpoint {rdzv.endpoint} --rdzv-id {rdzv.run_id}"
        + (f" --rdzv-conf {conf}" if conf else "")
        + f" {script}"
    )


def _composer(plan: LaunchPlan, script: str) -> str:
    rdzv = plan.rdzv
    if rdzv.backend != "static" and rdzv.max_nodes > 1:
        return "(no equivalent: Composer's launcher has no rendezvous; use --node-rank)"
    parts = [f"composer -n {plan.nproc}"]
    if rdzv.max_nodes > 1:
        parts.append(
            f"--world_size {plan.nproc * rdzv.max_nodes} --node_rank {rdzv.node_rank} "
            f"--master_addr {rdzv.host} --master_port {rdzv.port}"
        )
    elif rdzv.port:
        parts.append(f"--master_port {rdzv.port}")
    return " ".join([*parts, script])


def _ignite(plan: LaunchPlan) -> list[str]:
    rdzv = plan.rdzv
    if rdzv.backend != "static" and rdzv.max_nodes > 1:
        return ["(no equivalent: Ignite's Parallel has no rendezvous; use --node-rank)"]
    args = ['backend="gloo"', f"nproc_per_node={plan.nproc}"]
    if rdzv.max_nodes > 1:
        args += [
            f"nnodes={rdzv.max_nodes}",
            f"node_rank={rdzv.node_rank}",
            f'master_addr="{rdzv.host}"',
            f"master_port={rdzv.port}",
        ]
    return [
        "import ignite.distributed as idist",
        f"with idist.Parallel({', '.join(args)}) as parallel:",
        "    parallel.run(main)  # main(local_rank, ...) must be your script's entry function",
    ]
