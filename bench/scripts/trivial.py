"""A trivial 2-rank job (init, barrier, all_reduce, exit) that runs under any torch launcher.

With ``--fail PATH``, rank 1 writes the time to PATH and raises right after init.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist


def job(fail: str | None) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    if fail and dist.get_rank() == 1:
        with open(fail, "w") as out:
            out.write(repr(time.time()))
        raise ValueError("planned failure")
    dist.barrier()
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()


def ignite_main(local_rank: int, fail: str | None) -> None:
    import ignite.distributed as idist

    if fail and idist.get_rank() == 1:
        with open(fail, "w") as out:
            out.write(repr(time.time()))
        raise ValueError("planned failure")
    idist.barrier()
    idist.all_reduce(torch.ones(1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail", default=None)
    parser.add_argument("--ignite-parallel", type=int, metavar="MASTER_PORT")
    args = parser.parse_args()
    if args.ignite_parallel:
        import ignite.distributed as idist

        port = args.ignite_parallel
        with idist.Parallel(backend="gloo", nproc_per_node=2, master_port=port) as parallel:
            parallel.run(ignite_main, args.fail)
    else:
        assert "RANK" in os.environ, "start me with a launcher"
        job(args.fail)
