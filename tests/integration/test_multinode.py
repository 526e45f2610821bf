"""Jobs across simulated nodes: smddprun --simulate-nodes K runs K daemons on this machine,
each with its own segment and node id, their traffic through libfabric over loopback
(tcp;ofi_rxm) or shared memory (shm). Every collective and dtype, then the failure cases with
the victim on another node than some of the survivors."""
import os
import pathlib
import re
import signal
import subprocess
import time

import pytest

from conftest import bin_dir
from test_cpu_collectives import assert_all_ranks_passed
from test_failures import check_killed_rank, results, wait_for_files

PROVIDERS = ["tcp;ofi_rxm", "shm"]


def nodes(k, provider="tcp;ofi_rxm"):
    return ("--simulate-nodes", str(k), "--set", f"fabric.provider={provider}")


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("k", [2, 3])
def test_every_collective_small_sizes_across_nodes(job, k, provider):
    # Sizes 0, 1, 7 and 1 MiB + 3 elements, every dtype and reduce op, plus the communicator
    # {0, 2}, whose members live on two different nodes.
    r = job.run(2, "collective_check", "--subgroup", extra=nodes(k, provider))
    assert r.returncode == 0, r.stdout[-4000:]
    assert_all_ranks_passed(r.stdout, 2 * k)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("k", [2, 3])
def test_every_collective_64_mib_across_nodes(job, k, provider):
    # 64 chunks per operation in flight through the pipeline. One float and one half type keep
    # the test short; `--dtypes` left out checks all nine (a few minutes per configuration).
    r = job.run(2, "collective_check", "--sizes", "7", "--big-bytes", 64 << 20, "--dtypes", "float32,bfloat16",
                extra=nodes(k, provider))
    assert r.returncode == 0, r.stdout[-4000:]
    assert_all_ranks_passed(r.stdout, 2 * k)


def test_every_collective_over_four_fabric_endpoints_per_node(job):
    # fabric.endpoints=4 over tcp on loopback: collectives striped over the endpoints by chunk, the
    # communicator {0, 2} (one member per node) over its members' slots' endpoints; 16 MiB
    # operations in 16 chunks spread over all four.
    r = job.run(2, "collective_check", "--subgroup", "--big-bytes", 16 << 20, "--dtypes", "float32,bfloat16",
                extra=(*nodes(2), "--set", "fabric.endpoints=4"))
    assert r.returncode == 0, r.stdout[-4000:]
    assert_all_ranks_passed(r.stdout, 4)
    assert r.stdout.count("fabric: 4 endpoint(s), provider 'tcp;ofi_rxm'") == 2, r.stdout[-4000:]
    ends = re.findall(r"node (\d)\] info: fabric endpoint bytes: (.*)$", r.stdout, re.M)
    assert sorted(n for n, _ in ends) == ["0", "1"], r.stdout[-4000:]
    for node, text in ends:
        sent = [int(x) for x in re.findall(r"(\d+) sent", text)]
        received = [int(x) for x in re.findall(r"(\d+) received", text)]
        assert len(sent) == 4 and all(b > (1 << 20) for b in sent), f"node {node}: {text}"
        assert len(received) == 4 and all(b > (1 << 20) for b in received), f"node {node}: {text}"
    # The daemons' traffic counters: every node sent AllReduce and AllGather bytes on the fabric
    # and reduced AllReduce bytes on its CPU; an AllGather reduces nothing.
    traffic = {(n, op): (int(red), int(sent)) for n, op, red, sent in re.findall(
        r"node (\d)\] info: traffic (\w+): \d+ bytes GPU to arena, \d+ arena to GPU, (\d+) reduced by the daemon, "
        r"(\d+) sent on the fabric", r.stdout)}
    for node in ("0", "1"):
        assert traffic[(node, "allreduce")][0] > (16 << 20) // 2, traffic
        assert traffic[(node, "allreduce")][1] > (16 << 20) // 2, traffic
        assert traffic[(node, "allgather")][0] == 0 and traffic[(node, "allgather")][1] > (16 << 20) // 2, traffic


@pytest.mark.skipif(os.environ.get("SMDDP_LONG_TESTS") != "1",
                    reason="long run (all nine dtypes at 64 MiB, minutes per configuration): scripts/test.sh --long")
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("k", [2, 3])
def test_every_collective_64_mib_all_dtypes_across_nodes(job, k, provider):
    # The limit catches a hang: on a 2-vCPU machine whose page faults were slow the run passed 600 s.
    r = job.run(2, "collective_check", "--sizes", "7", "--big-bytes", 64 << 20, extra=nodes(k, provider), timeout=1800)
    assert r.returncode == 0, r.stdout[-4000:]
    assert_all_ranks_passed(r.stdout, 2 * k)


@pytest.mark.parametrize("algorithm", ["ring", "halving", "auto"])
def test_every_collective_across_8_nodes_by_algorithm(job, algorithm):
    # 8 daemons, one rank each: the ring's 7 steps, halving's 3 exchanges, and auto's choice
    # (at 8 nodes: tiny data eagerly, the rest directly). Float32 only, sizes 1, 7 (fewer elements
    # than nodes: empty segments) and 1 MiB + 3 elements (a full chunk and one of 3 elements),
    # plus the communicator {0, 2} (two nodes).
    r = job.run(1, "collective_check", "--sizes", "1,7,262147", "--dtypes", "float32", "--subgroup",
                extra=(*nodes(8), "--set", f"fabric.algorithm={algorithm}"))
    assert r.returncode == 0, r.stdout[-4000:]
    assert_all_ranks_passed(r.stdout, 8)


@pytest.mark.skipif(os.environ.get("SMDDP_LONG_TESTS") != "1",
                    reason="long run (three dtypes, 16 MiB, 8 nodes, every algorithm): scripts/test.sh --long")
@pytest.mark.parametrize("algorithm", ["direct", "ring", "halving", "auto"])
def test_every_collective_across_8_nodes_by_algorithm_all_dtypes(job, algorithm):
    r = job.run(1, "collective_check", "--sizes", "0,1,7,262147", "--big-bytes", 16 << 20,
                "--dtypes", "float32,bfloat16,int64", extra=(*nodes(8), "--set", f"fabric.algorithm={algorithm}"),
                timeout=1500)
    assert r.returncode == 0, r.stdout[-4000:]
    assert_all_ranks_passed(r.stdout, 8)


def test_nodes_with_different_rank_counts_are_refused(job):
    # smddprun gives every node the same count; a hand-made mpirun line might not.
    daemon = str(bin_dir() / "smddp-daemon")
    common = ["--job-id", job.id, "--simulate-nodes", "2"]
    cmd = ["mpirun", "--oversubscribe", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo",
           "--mca", "oob_tcp_if_include", "lo"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += ["-np", "1", daemon, *common, "--nproc-per-node", "1", "--", "/bin/true", ":",
            "-np", "1", daemon, *common, "--nproc-per-node", "2", "--", "/bin/true"]
    r = subprocess.run(cmd, env=job.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    assert r.returncode != 0
    assert "nodes run different numbers of ranks (1 to 2)" in r.stdout, r.stdout[-3000:]


def test_mismatch_across_nodes_names_every_call_everywhere(job):
    r = job.run(2, "failure_worker", "--mode", "mismatch", extra=nodes(2))
    assert r.returncode == 0, r.stdout[-3000:]
    res = results(r.stdout)
    assert sorted(res) == [0, 1, 2, 3], r.stdout[-3000:]
    for rank, (_, msg) in res.items():
        assert "collective mismatch" in msg, msg
        for other in range(4):
            assert f"rank {other} called allreduce(float32, count={8 + other}" in msg, msg
    assert len(re.findall(r"^AFTER \d 4$", r.stdout, re.M)) == 4, r.stdout[-3000:]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_refused_request_fails_its_partners_on_other_nodes_at_once(job, provider):
    # Rank 1 (node 0) posts an allreduce its daemon refuses; ranks 2 and 3 (node 1) used to wait
    # for the collective timeout (here 60 s). Then rank 1's refused send leaves rank 2's recv
    # waiting the same way. Every rank must fail within seconds, naming rank 1's refusal, and
    # the communicator goes on.
    r = job.run(2, "failure_worker", "--mode", "refused", "--victim", 1,
                extra=(*nodes(2, provider), "--set", "daemon.collective_timeout_s=60"), timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    res = results(r.stdout)
    assert sorted(res) == [0, 1, 2, 3], r.stdout[-3000:]
    for rank, (_, msg) in res.items():
        took = float(re.match(r"after ([\d.]+) s", msg).group(1))
        assert took < 10.0, (rank, msg)
        want = "input buffer missing" if rank == 1 else "rank 1's allreduce was refused"
        assert want in msg, (rank, msg)
    p2p = {int(m.group(1)): (float(m.group(3)), m.group(4))
           for m in re.finditer(r"^P2P (\d+) ([\d.]+) after ([\d.]+) s: (.*)$", r.stdout, re.M)}
    assert sorted(p2p) == [1, 2], r.stdout[-3000:]
    assert p2p[2][0] < 10.0 and "rank 1's send was refused" in p2p[2][1], p2p[2]
    assert len(re.findall(r"^AFTER \d 4$", r.stdout, re.M)) == 4, r.stdout[-3000:]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_killed_rank_on_another_node_fails_every_rank_within_5s(job, provider):
    # Rank 2 lives on node 1; ranks 0 and 1 on node 0 learn it from node 1's daemon.
    check_killed_rank(job, 2, extra=nodes(2, provider))


@pytest.mark.parametrize("provider", PROVIDERS)
def test_killed_daemon_on_another_node_fails_every_rank_within_5s(job, provider):
    # Rank 3's daemon is node 1's: ranks 0 and 1 (node 0) hear it from their daemon, rank 2
    # (node 1) sees its own daemon die.
    proc = job.start(2, "failure_worker", "--mode", "stuck", "--victim", 3, "--dir", job.dir, extra=nodes(2, provider))
    victim = None
    try:
        wait_for_files([job.dir / f"ready.{r}" for r in range(4)] + [job.dir / "victim.pid"])
        time.sleep(0.5)
        victim = int((job.dir / "victim.pid").read_text())
        daemon = int(open(f"/proc/{victim}/stat").read().split(")")[1].split()[1])
        killed_at = time.time()
        os.kill(daemon, signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        if victim:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode != 0
    res = results(out)
    assert sorted(res) == [0, 1, 2], out[-3000:]
    for rank, (at, msg) in res.items():
        assert at - killed_at < 5.0, (rank, at - killed_at, msg)
        assert f"smddp daemon (pid {daemon}) on node 1 died" in msg, msg
    # smddprun's cleanup removed the killed daemon's leftovers, libfabric's shm region included.
    assert not list(pathlib.Path("/dev/shm").glob(f"{daemon}:*"))
