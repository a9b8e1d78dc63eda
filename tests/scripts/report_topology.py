"""Print every rank's topology as seen through one adapter, under whatever launcher started us.

    python report_topology.py ADAPTER [--ignite-parallel]

Rank 0 prints one line ``TOPOLOGY <json list, one entry per rank>``.
"""

from __future__ import annotations

import json
import sys

import unidist


def main(_local_rank: int | None = None, adapter: str = "torch") -> None:
    unidist.initialize("gloo", adapter=adapter, timeout=60)
    mine = unidist.topology().as_dict()
    mine.pop("launcher")
    everyone = unidist.all_gather_object({**mine, "adapter": unidist.current_adapter().name})
    if unidist.is_main_process():
        print("TOPOLOGY " + json.dumps(everyone), flush=True)
    unidist.finalize()


if __name__ == "__main__":
    chosen = sys.argv[1]
    if "--ignite-parallel" in sys.argv:  # followed by a free port (Ignite's default is 2222)
        import ignite.distributed as idist

        port = int(sys.argv[sys.argv.index("--ignite-parallel") + 1])
        with idist.Parallel(backend="gloo", nproc_per_node=2, master_port=port) as parallel:
            parallel.run(main, adapter=chosen)
    else:
        main(adapter=chosen)
