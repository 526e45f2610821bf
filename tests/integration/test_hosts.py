"""Jobs across hosts, not simulated nodes: each host a set of Linux namespaces (tests/integration/
hosts.py, scripts/hosts.sh) with its own network, /dev/shm, /tmp and host name. smddprun -H and
--hostfile start a daemon per host through mpirun's remote-shell agent, the daemons pick the
interface that reaches the other hosts (fabric.interface = auto) and talk libfabric tcp over the
hosts' veth addresses. Every collective and dtype, the interface rules, and failures on the
other host; nothing may be left on any host."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, bin_dir
from hosts import Bed
from test_cpu_collectives import assert_all_ranks_passed
from test_failures import results, wait_for_files


@pytest.fixture
def bed(request):
    beds = []

    def make(k):
        b = Bed(k)
        beds.append(b)
        return b

    yield make
    for b in beds:
        try:
            left = b.leftovers(wait_s=10.0)
        finally:
            b.down()
        assert not left, "left on the hosts after the job: %s" % left


def fabric_interfaces(out):
    return sorted(set(re.findall(r"info: fabric: interface '([^']+)' \(([^)]*)", out)))


@pytest.mark.parametrize("k,nproc,hostfile", [(2, 2, False), (3, 1, True)], ids=["2x2-H", "3x1-hostfile"])
def test_every_collective_and_dtype_across_hosts(bed, k, nproc, hostfile):
    b = bed(k)
    # Sizes 0, 1, 7 and 1 MiB + 3 elements, every dtype and reduce op, and the communicator {0, 2}
    # whose members live on different hosts.
    r = b.smddprun(nproc, "collective_check", "--subgroup", hostfile=hostfile)
    assert r.returncode == 0, r.stdout[-4000:]
    assert_all_ranks_passed(r.stdout, k * nproc)
    # Every daemon on its own host, each over eth0 (auto), none over loopback.
    hosts = set(re.findall(r"topology: node \d+ of %d on (\S+)," % k, r.stdout))
    assert hosts == set(b.names), r.stdout[-4000:]
    chosen = re.findall(r"info: fabric: interface '([^']+)' \(the route to ", r.stdout)
    assert chosen == ["eth0"] * k, r.stdout[-4000:]
    addresses = re.findall(r"fabric endpoint 0: device '[^']*', address (\S+)", r.stdout)
    assert len(addresses) == k and all("10.77.0." in a for a in addresses), addresses


@pytest.mark.parametrize("k,nproc,hostfile", [(2, 2, False), (3, 1, True)], ids=["2x2-H", "3x1-hostfile"])
def test_every_collective_at_64_mib_across_hosts(bed, k, nproc, hostfile):
    # One float and one half type; every dtype in the long run (below).
    b = bed(k)
    r = b.smddprun(nproc, "collective_check", "--sizes", "7", "--big-bytes", 64 << 20, "--dtypes", "float32,bfloat16",
                   hostfile=hostfile)
    assert r.returncode == 0, r.stdout[-4000:]
    assert_all_ranks_passed(r.stdout, k * nproc)


@pytest.mark.skipif(os.environ.get("SMDDP_LONG_TESTS") != "1",
                    reason="long run (all nine dtypes at 64 MiB across hosts): scripts/test.sh --long")
@pytest.mark.parametrize("k,nproc", [(2, 2), (3, 1)], ids=["2x2", "3x1"])
def test_every_collective_64_mib_all_dtypes_across_hosts(bed, k, nproc):
    b = bed(k)
    r = b.smddprun(nproc, "collective_check", "--sizes", "7", "--big-bytes", 64 << 20, timeout=1800)
    assert r.returncode == 0, r.stdout[-4000:]
    assert_all_ranks_passed(r.stdout, k * nproc)


def test_a_loopback_interface_is_refused_across_hosts(bed):
    b = bed(2)
    t0 = time.time()
    r = b.smddprun(1, "collective_check", "--sizes", "7", extra=("--set", "fabric.interface=lo"), timeout=120)
    assert r.returncode != 0, r.stdout[-4000:]
    assert time.time() - t0 < 60
    for me, other in ((0, 1), (1, 0)):
        assert ("fabric.interface = lo is a loopback interface, but this job also runs on %s (node %d)"
                % (b.names[other], other)) in r.stdout, r.stdout[-4000:]
    assert "rank 0:" not in r.stdout  # no rank ran a collective


def test_a_peer_that_cannot_be_reached_is_named_unreachable_at_its_address(bed):
    b = bed(2)
    # A second network on each host that leads nowhere; the daemons are told to use it.
    for i, name in enumerate(b.names, 1):
        r = b.run_on(name, ["sh", "-c", "ip link add eth1 type veth peer name eth1p && ip addr add 10.88.0.%d/24 dev eth1 "
                                        "&& ip link set eth1 up && ip link set eth1p up" % i])
        assert r.returncode == 0, r.stdout
    # MPI itself kept on eth0: Open MPI's TCP would also try eth1 and wait on it.
    mpi_on_eth0 = ("--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0")
    t0 = time.time()
    r = b.smddprun(1, "collective_check", "--sizes", "7", "--dtypes", "float32",
                   extra=(*mpi_on_eth0, "--set", "fabric.interface=eth1"), timeout=120)
    assert r.returncode != 0, r.stdout[-4000:]
    assert time.time() - t0 < 60
    for me, other in ((0, 1), (1, 0)):
        pattern = (r"rank %d FAIL .*cannot reach the smddp daemon \(pid \d+\) on node %d \(host %s, address "
                   r"fi_sockaddr_in://10\.88\.0\.%d:\d+\): nothing arrived from it in 2000 ms" % (me, other, b.names[other], other + 1))
        assert re.search(pattern, r.stdout), r.stdout[-4000:]
    assert "died" not in r.stdout, r.stdout[-4000:]


def start_stuck_job(b, victim, extra=()):
    """failure_worker --mode stuck over 2 hosts x 2 ranks: rank `victim` sleeps, the others wait
    in an allreduce. Returns (proc, pids of the ranks by rank)."""
    proc = b.start_smddprun(2, "failure_worker", "--mode", "stuck", "--victim", victim, "--dir", b.shared,
                            extra=extra)
    try:
        wait_for_files([b.shared / f"ready.{r}" for r in range(4)])
    except AssertionError:
        finish(b, proc, timeout=0)
    time.sleep(0.5)  # the others are now inside their allreduce
    return proc, {r: int((b.shared / f"ready.{r}").read_text()) for r in range(4)}


def parent_of(pid):
    return int(open(f"/proc/{pid}/stat").read().split(")")[1].split()[1])


def finish(b, proc, timeout=60):
    """smddprun's output once it has exited; fails if it has not within `timeout`."""
    try:
        proc.wait(timeout=timeout)
    except Exception:
        proc.kill()
        proc.wait()
        raise AssertionError("smddprun did not end within %d s:\n%s" % (timeout, proc.output.read_text()[-4000:]))
    return proc.output.read_text()


def assert_survivors_named(out, proc, killed_at, survivors, *needles):
    """The job failed, and each survivor's RESULT came within 5 s and holds every needle."""
    assert proc.returncode != 0, out[-4000:]
    res = results(out)
    assert sorted(res) == survivors, out[-4000:]
    for rank, (at, msg) in res.items():
        assert at - killed_at < 5.0, (rank, at - killed_at, msg)
        assert all(n in msg for n in needles), (needles, msg)


def test_a_rank_killed_on_the_other_host_fails_every_rank(bed):
    b = bed(2)
    proc, pids = start_stuck_job(b, victim=2)  # rank 2 runs on the second host
    killed_at = time.time()
    os.kill(pids[2], signal.SIGKILL)
    assert_survivors_named(finish(b, proc), proc, killed_at, [0, 1, 3], f"rank 2 (pid {pids[2]})", "SIGKILL")


def test_a_daemon_killed_on_the_other_host_fails_every_rank(bed):
    b = bed(2)
    # Rank 3 never calls smddp again: its orphan watch ends it 5 s after its daemon (60 s by default).
    proc, pids = start_stuck_job(b, victim=3, extra=("--set", "daemon.orphan_grace_s=5"))
    daemon = parent_of(pids[3])  # the second host's daemon spawned rank 3
    killed_at = time.time()
    os.kill(daemon, signal.SIGKILL)
    # Rank 2 shares the dead daemon's host; ranks 0 and 1 hear it from theirs.
    assert_survivors_named(finish(b, proc), proc, killed_at, [0, 1, 2], f"(pid {daemon}) on node 1")


def test_a_host_cut_off_fails_every_rank_and_the_job_ends(bed):
    b = bed(2)
    proc, pids = start_stuck_job(b, victim=3)  # rank 3 sleeps; the others wait in an allreduce
    cut_at = time.time()
    assert os.system("ip -n smddp-sw link set h2 down") == 0  # the second host's link to the bridge
    out = finish(b, proc, timeout=120)
    assert proc.returncode != 0, out[-4000:]
    # What the cut-off host's ranks said cannot reach this side; this side's must say it all.
    res = results(out)
    assert sorted(res) == [0, 1], out[-4000:]
    for rank, (at, msg) in res.items():
        assert at - cut_at < 5.0, (rank, at - cut_at, msg)
        assert "on node 1 stopped answering: no heartbeat from %s" % b.names[1] in msg, msg
    assert "mpirun has not ended 20 s after this machine's smddp daemon exited" in out, out[-4000:]
    # The cut-off host's daemon failed its job on its own (node 0 fell silent) and ended its ranks;
    # mpirun's orted there goes once the host is back and finds mpirun gone.
    assert os.system("ip -n smddp-sw link set h2 up") == 0
    left = b.leftovers(wait_s=90)
    assert not left, "left on the hosts 90 s after the cut-off host came back: %s" % left


WORKERS = REPO / "tests" / "python" / "workers"


def python_env(b):
    """What the plugin's Python workers need on every host: the package, their helpers, and a
    records folder every host sees (workers/common.py emit())."""
    records = b.shared / "records"
    records.mkdir(exist_ok=True)
    return records, {"PYTHONPATH": "%s:%s" % (bin_dir().parent / "python", WORKERS), "PYTHONDONTWRITEBYTECODE": "1",
                     "OMP_NUM_THREADS": "1", "SMDDP_TEST_RECORDS": str(records)}


def ddp_checks(records, world):
    """rank -> (checks made, failed, names), from the workers' record files."""
    text = "".join(p.read_text() for p in sorted(records.glob("records.*")))
    done = {int(r): (int(c), int(f)) for r, c, f in re.findall(r"^SMDDP-DONE rank (\d+) checks (\d+) failed (\d+)$",
                                                                 text, re.M)}
    names = {}
    for r, name, status in re.findall(r"^SMDDP-CHECK (\d+) (\S+) (\S+)", text, re.M):
        names.setdefault(int(r), {})[name] = status
    assert sorted(done) == list(range(world)), "SMDDP-DONE from ranks %s:\n%s" % (sorted(done), text[-3000:])
    return done, names


def assert_ddp_passed(out, records, world):
    done, names = ddp_checks(records, world)
    for r, (made, failed) in done.items():
        assert failed == 0 and made >= 8, "rank %d: %d checks, %d failed: %s\n%s" % (
            r, made, failed, {n: s for n, s in names[r].items() if s != "OK"}, out[-3000:])
    for case in ("plain", "no_sync", "find_unused_parameters", "gradient_as_bucket_view", "fp16_compress_hook"):
        assert names[0].get("ddp." + case) == "OK", (case, names[0])


def test_ddp_matches_gloo_and_the_reference_across_hosts(bed):
    # tests/python/workers/ddp_worker.py: 20 steps of DDP on smddp against DDP on gloo (also across
    # the hosts) and a full-batch reference, for several DDP options; 2 hosts x 2 ranks.
    b = bed(2)
    records, env = python_env(b)
    argv = b.smddprun_argv(2, None, command=[sys.executable, WORKERS / "ddp_worker.py"])
    r = b.run_on(b.names[0], argv, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-4000:]
    assert_ddp_passed(r.stdout, records, 4)


def test_plain_mpirun_across_hosts_starts_a_daemon_per_host(bed):
    # Launch path 2: plain mpirun of the training script; each host's local rank 0 starts its
    # daemon, which picks the interface towards MASTER_ADDR and bootstraps through the Store.
    b = bed(2)
    records, env = python_env(b)
    env.update({"SMDDP_DAEMON": str(bin_dir() / "smddp-daemon"), "MASTER_ADDR": b.names[0], "MASTER_PORT": "29517"})
    argv = ["mpirun", "--allow-run-as-root", "-H", "%s:2,%s:2" % tuple(b.names), "-np", "4", "--bind-to", "none",
            "--mca", "btl_vader_single_copy_mechanism", "none"]
    for name in env:
        argv += ["-x", name]
    argv += [sys.executable, WORKERS / "ddp_worker.py"]
    r = b.run_on(b.names[0], argv, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-4000:]
    assert_ddp_passed(r.stdout, records, 4)
    jobs = set(re.findall(r"^SMDDP-JOB \d+ \S+ \d+ 2$", "".join(p.read_text() for p in records.glob("records.*")), re.M))
    assert len(jobs) == 4, jobs  # every rank took launch path 2


def start_on_hosts(b, per_host, env):
    """Starts per_host(host index, host name) -> [(argv, extra env)] on every host at once;
    returns the processes, each with its output in a file (proc.output)."""
    procs = []
    for h, name in enumerate(b.names):
        for i, (argv, extra) in enumerate(per_host(h, name)):
            output = b.shared / ("out.%s.%d" % (name, i))
            with open(output, "w") as out:
                proc = subprocess.Popen(b.argv_on(name, argv), env=b.env({**env, **extra}), text=True,
                                        stdout=out, stderr=subprocess.STDOUT)
            proc.output = output
            procs.append(proc)
    return procs


def wait_all(b, procs, timeout=600):
    outs = [finish(b, p, timeout=timeout) for p in procs]
    return [p.returncode for p in procs], "\n".join(outs)


def test_each_host_launching_its_own_ranks_with_a_shared_rendezvous(bed):
    # What torchrun does on each host (--nnodes 2 --node_rank N --nproc_per_node 2 with a shared
    # rendezvous), done by the test: every worker gets RANK, WORLD_SIZE, LOCAL_RANK,
    # LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT; each host's local rank 0 starts its daemon.
    b = bed(2)
    records, env = python_env(b)
    env.update({"SMDDP_DAEMON": str(bin_dir() / "smddp-daemon"), "MASTER_ADDR": b.names[0], "MASTER_PORT": "29518",
                "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"})

    def workers(h, name):
        return [([sys.executable, WORKERS / "ddp_worker.py"], {"RANK": str(2 * h + l), "LOCAL_RANK": str(l)})
                for l in range(2)]

    codes, out = wait_all(b, start_on_hosts(b, workers, env))
    assert codes == [0, 0, 0, 0], out[-4000:]
    assert_ddp_passed(out, records, 4)


def torchrun_broken():
    """None when torchrun can start a worker with this interpreter, else why not (Debian's torch
    1.13 torchrun dies under Python 3.11 before it starts any worker)."""
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_addr",
                           "127.0.0.1", "--master_port", "29519", "--no_python", "echo", "SMDDP-TORCHRUN-OK"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    if proc.returncode == 0 and "SMDDP-TORCHRUN-OK" in proc.stdout:
        return None
    return "torchrun cannot start a worker with %s: %s" % (sys.executable, (proc.stdout.strip().splitlines() or ["?"])[-1])


def test_torchrun_on_each_host_with_a_shared_rendezvous(bed):
    why = torchrun_broken()
    if why:
        pytest.skip(why)
    b = bed(2)
    records, env = python_env(b)
    env["SMDDP_DAEMON"] = str(bin_dir() / "smddp-daemon")

    def torchrun(h, name):
        return [([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(h),
                  "--nproc_per_node", "2", "--master_addr", b.names[0], "--master_port", "29520",
                  WORKERS / "ddp_worker.py"], {})]

    codes, out = wait_all(b, start_on_hosts(b, torchrun, env))
    assert codes == [0, 0], out[-4000:]
    assert_ddp_passed(out, records, 4)
