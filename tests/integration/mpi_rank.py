"""A rank script of test_mpi_ranks.py, run under smddprun, usually as
`python3 -m mpi4py mpi_rank.py DIR MODE` (the form SageMaker's launch line uses).

It writes what the rank saw to DIR/rank.<RANK>.json (a file per rank: a launcher's output
forwarding can cut stdout lines). Modes:
  mpi      initialise MPI and report COMM_WORLD's rank and size;
  raise    rank 1 raises an uncaught exception after MPI is up (python -m mpi4py then calls
           MPI_Abort); the others report and wait to be stopped by the job's failure;
  env      report the environment only, without touching MPI.
"""
import json
import os
import shutil
import sys
import time

LAUNCHER_PREFIXES = ("OMPI_", "PMIX_", "OPAL_", "PRTE_", "ORTE_")
ISOLATED = "OMPI_MCA_ess_singleton_isolated"


def main():
    out_dir, mode = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    info = {
        "rank_env": rank,
        "world_env": int(os.environ["WORLD_SIZE"]),
        "ssh": shutil.which("ssh"),
        "rsh": shutil.which("rsh"),
        "isolated": os.environ.get(ISOLATED),
        "launcher_vars": sorted(k for k in os.environ if k.startswith(LAUNCHER_PREFIXES) and k != ISOLATED),
        # `python -m mpi4py` runs the script through mpi4py.run, which aborts the job on an
        # uncaught exception.
        "under_mpi4py_run": "mpi4py.run" in sys.modules,
    }
    if mode in ("mpi", "raise"):
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        info.update(comm_rank=comm.Get_rank(), comm_size=comm.Get_size(),
                    # A collective on COMM_WORLD works: it is a world of one.
                    comm_sum=comm.allreduce(rank + 1))
    with open(os.path.join(out_dir, "rank.%d.json.tmp" % rank), "w") as f:
        json.dump(info, f)
    os.rename(os.path.join(out_dir, "rank.%d.json.tmp" % rank), os.path.join(out_dir, "rank.%d.json" % rank))
    if mode == "raise":
        if rank == 1:
            raise RuntimeError("rank 1 fails on purpose")
        time.sleep(120)  # stopped by the job's failure long before


if __name__ == "__main__":
    main()
