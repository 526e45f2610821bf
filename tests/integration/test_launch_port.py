"""The rendezvous port (MASTER_PORT) cannot be lost at launch: node 0's daemon chooses it and
keeps it bound (daemon/reserved_port.hpp) while the daemons open their fabric endpoints, whose
ephemeral ports could otherwise take it before rank 0's TCPStore binds it. Small jobs across 2
simulated nodes with 4 endpoints each, back to back; rank 0 binds and listens on MASTER_PORT
as TCPStore does (SO_REUSEADDR, "::" first, then 0.0.0.0). 20 launches here, 200 in the long run."""
import os
import subprocess
import sys

from conftest import REPO, bin_dir

RANK = r"""
import os, socket, sys
if os.environ["RANK"] == "0":
    port = int(os.environ["MASTER_PORT"])
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
            s.listen(8)
            break
        except OSError as e:
            err = e
    else:
        print("LISTEN-FAILED port %d: %s" % (port, err), flush=True)
        sys.exit(3)
print("LISTEN-OK rank %s" % os.environ["RANK"], flush=True)
"""


def test_back_to_back_launches_never_lose_the_rendezvous_port(job, tmp_path):
    launches = 200 if os.environ.get("SMDDP_LONG_TESTS") == "1" else 20
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    failed = []
    base = job.id
    for i in range(launches):
        job.id = "%s-%d" % (base, i)  # the fixture checks the last job's leftovers; each is checked here
        argv = [str(bin_dir() / "smddprun"), "--job-id", job.id, "--nproc-per-node", "1",
                "--config", str(REPO / "configs" / "local.ini"), "--simulate-nodes", "2",
                "--set", "fabric.endpoints=4", "--", sys.executable, str(script)]
        r = subprocess.run(argv, env=job.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=120)
        if r.returncode != 0 or r.stdout.count("LISTEN-OK") != 2:
            failed.append((i, r.returncode, r.stdout[-1500:]))
        assert not job.leftovers(), (i, job.leftovers())
    assert not failed, "%d of %d launches failed; first: %s" % (len(failed), launches, failed[0])
