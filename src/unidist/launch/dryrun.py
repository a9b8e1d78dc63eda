"""``unidist launch --dry-run``: the resolved topology and the equivalent commands of the peers."""

from __future__ import annotations

import shlex

from unidist.launch.plan import LaunchPlan

__all__ = ["describe"]


def describe(plan: LaunchPlan) -> str:
    """What the launch would do, and how torchrun, Composer and Ignite would say it."""
    target = ["-m", str(plan.target)] if plan.module else [str(plan.target)]
    script = shlex.join([*target, *plan.args])
    port = plan.master_port or "<free port>"
    lines = [
        "unidist launch --dry-run (nothing was started)",
        f"  nodes          {plan.nnodes} (this is node {plan.node_rank})",
        f"  processes      {plan.nproc} on this node, {plan.world_size} in all",
        f"  global ranks   {plan.node_rank * plan.nproc}..{(plan.node_rank + 1) * plan.nproc - 1}"
        " on this node",
        f"  rendezvous     {plan.master_addr or 'localhost'}:{port} "
        f"({'c10d, free port chosen by node 0' if plan.nnodes == 1 else 'static'})",
        f"  logs           {plan.stdout}",
        f"                 {plan.stderr}",
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


def _torchrun(plan: LaunchPlan, script: str) -> str:
    if plan.nnodes == 1:
        where = (
            "--standalone"
            if not plan.master_port
            else (f"--rdzv-endpoint {plan.master_addr or 'localhost'}:{plan.master_port}")
        )
        return f"torchrun {where} --nproc-per-node {plan.nproc} {script}"
    return (
        f"torchrun --nnodes {plan.nnodes} --node-rank {plan.node_rank} --nproc-per-node "
        f"{plan.nproc} --master-addr {plan.master_addr} --master-port {plan.master_port} "
        f"{script}"
    )


def _composer(plan: LaunchPlan, script: str) -> str:
    parts = [f"composer -n {plan.nproc}"]
    if plan.nnodes > 1:
        parts.append(
            f"--world_size {plan.world_size} --node_rank {plan.node_rank} "
            f"--master_addr {plan.master_addr} --master_port {plan.master_port}"
        )
    elif plan.master_port:
        parts.append(f"--master_port {plan.master_port}")
    return " ".join([*parts, script])


def _ignite(plan: LaunchPlan) -> list[str]:
    args = ['backend="gloo"', f"nproc_per_node={plan.nproc}"]
    if plan.nnodes > 1:
        args += [
            f"nnodes={plan.nnodes}",
            f"node_rank={plan.node_rank}",
            f'master_addr="{plan.master_addr}"',
            f"master_port={plan.master_port}",
        ]
    return [
        "import ignite.distributed as idist",
        f"with idist.Parallel({', '.join(args)}) as parallel:",
        "    parallel.run(main)  # main(local_rank, ...) must be your script's entry function",
    ]
