"""Shared fixtures of the plugin tests: where the build is, and how to run an smddp job.

Every multi-rank test runs through both launch paths: smddprun (path 1: the daemon spawns
the ranks) and plain mpirun (path 2: the plugin starts `smddp-daemon --attach-mode`).

Environment: SMDDP_BUILD_DIR (set by CTest; or the parent of SMDDP_BIN_DIR; default: the newest build-* folder beside the
sources that has the extension), SMDDP_DAEMON (default <build>/bin/smddp-daemon),
SMDDP_TEST_PYTHON (default /usr/bin/python3).
"""

import glob
import os
import random
import re
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "workers")
SOURCE_ROOT = os.path.dirname(os.path.dirname(HERE))


def _has_extension(build):
    return bool(glob.glob(os.path.join(build, "python/smdistributed/dataparallel/torch/_smddp_c*.so")))


def build_dir():
    env = os.environ.get("SMDDP_BUILD_DIR")
    if env:
        return env
    bin_dir = os.environ.get("SMDDP_BIN_DIR")
    if bin_dir:
        return os.path.dirname(os.path.abspath(bin_dir))
    candidates = [d for d in glob.glob(os.path.join(SOURCE_ROOT, "build*")) if _has_extension(d)]
    if not candidates:
        pytest.skip("no smddp build with the torch plugin found (set SMDDP_BUILD_DIR)")
    return max(candidates, key=os.path.getmtime)


def python_exe():
    return os.environ.get("SMDDP_TEST_PYTHON", "/usr/bin/python3")


def daemon_path(build):
    path = os.environ.get("SMDDP_DAEMON") or os.path.join(build, "bin", "smddp-daemon")
    if not os.access(path, os.X_OK):
        pytest.skip("smddp-daemon not built (%s)" % path)
    return path


def base_env(build):
    env = dict(os.environ)
    py = os.path.join(build, "python")
    env["PYTHONPATH"] = os.pathsep.join([py, WORKERS] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")  # 2-core machines: ranks must not oversubscribe
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SMDDP_JOB_ID", "SMDDP_NODE_ID",
                 "MASTER_ADDR", "MASTER_PORT", "SMDDP_ATTACH_MODE", "SMDDP_DAEMON", "SMDDP_DAEMON_LOG",
                 "SMDDP_SIMULATE_NODES", "SMDDP_ATTACH_TIMEOUT", "SMDATAPARALLEL_LOCAL_RANK"):
        env.pop(name, None)
    return env


LAUNCHERS = ("smddprun", "mpirun")

# Plain mpirun as root on a loopback-only machine (launch path 2: the plugin starts the daemon).
MPIRUN_FLAGS = ("--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                "--mca", "btl", "self,vader,tcp", "--mca", "btl_vader_single_copy_mechanism", "none",
                "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo")


def free_port():
    """A free TCP port below the kernel's ephemeral range. A port the kernel handed out (bind to
    0) is free only until the next process asks for one: mpirun's out-of-band listener once took
    the MASTER_PORT a test had picked, rank 0's store could not bind it, and the other ranks hung
    talking to mpirun. Ports below the range are never handed out that way."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    low = max(low, 12000)
    for _ in range(200):
        port = random.randrange(10000, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port in 10000-{low - 1} on 127.0.0.1")


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is gone for our purposes (its parent, a rank, may not have reaped it yet).
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ---- skips, counted where the suites are counted ----------------------------------------------
SKIP_EXIT = 77  # ctest's SKIP_RETURN_CODE (tests/python and tests/gpu CMakeLists.txt): shown as Skipped


def _skip_reason(report):
    lr = report.longrepr
    return lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr)


def pytest_sessionfinish(session, exitstatus):
    """pytest exits 0 when every test skipped, which ctest would count as Passed. Here a run in
    which no test ran (all skipped, or none collected) exits SKIP_EXIT instead; under
    SMDDP_MUST_RUN=1 (a suite that must run on this machine) any skip fails the run. Runs with
    skips write their summary into SMDDP_SKIP_REPORT (a folder: scripts/test.sh prints it)."""
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is None:
        return
    stats = tr.stats
    skipped = stats.get("skipped", [])
    ran = sum(len(stats.get(k, [])) for k in ("passed", "failed", "error", "xfailed", "xpassed"))
    reasons = sorted({_skip_reason(r) for r in skipped})
    folder = os.environ.get("SMDDP_SKIP_REPORT")
    if folder:
        suite = os.environ.get("SMDDP_SUITE") or "_".join(os.path.basename(str(a)) for a in session.config.args)
        path = os.path.join(folder, suite + ".txt")
        if skipped or ran == 0:
            os.makedirs(folder, exist_ok=True)
            with open(path, "w") as f:
                f.write("%s: %d ran, %d skipped: %s\n" % (suite, ran, len(skipped), "; ".join(reasons) or "no tests"))
        elif os.path.exists(path):
            os.remove(path)
    if exitstatus not in (0, 5):  # failures stay failures
        return
    if os.environ.get("SMDDP_MUST_RUN") == "1" and (skipped or ran == 0):
        tr.write_line("FAILED: %d tests skipped (%d ran) in a suite that must run here (SMDDP_MUST_RUN=1): %s"
                      % (len(skipped), ran, "; ".join(reasons) or "no tests collected"), red=True)
        session.exitstatus = 1
    elif ran == 0:
        tr.write_line("every test skipped (%s): exit %d, which ctest reports as Skipped"
                      % ("; ".join(reasons) or "no tests collected", SKIP_EXIT), yellow=True)
        session.exitstatus = SKIP_EXIT


@pytest.fixture
def master_port():
    return str(free_port())


def read_records(folder):
    """The record lines the workers wrote into `folder` (workers/common.py emit()); "" if none."""
    lines = []
    for path in sorted(glob.glob(os.path.join(folder, "records.*"))):
        with open(path) as f:
            lines.append(f.read())
    shutil.rmtree(folder, ignore_errors=True)
    return "".join(lines)


class JobResult:
    def __init__(self, proc, launcher="smddprun", elapsed=0.0, records="", world=1):
        self.returncode = proc.returncode
        self.output = proc.stdout
        self.launcher = launcher
        self.elapsed = elapsed
        self.world = world  # ranks the job started
        self.records = records or self.output  # the record lines (workers/common.py emit())
        self.checks = {}  # (rank, name) -> (ok, detail)
        self.check_lines = {}  # rank -> SMDDP-CHECK lines read (a name reported twice counts twice)
        self.done = {}  # rank -> (checks, failed) from 'SMDDP-DONE rank N checks C failed F'
        self.jobs = {}  # rank -> (job id, daemon pid, launch path) from 'SMDDP-JOB' lines
        # The workers' own record files where they wrote them: whole lines, whatever the
        # launcher did to the output they also went to.
        for line in self.records.splitlines():
            if line.startswith("SMDDP-JOB "):
                parts = line.split()
                if len(parts) == 5:
                    self.jobs[int(parts[1])] = (parts[2], int(parts[3]), parts[4])
            m = re.match(r"SMDDP-DONE rank (\d+) checks (\d+) failed (\d+)$", line)
            if m:
                self.done[int(m.group(1))] = (int(m.group(2)), int(m.group(3)))
            if "SMDDP-CHECK " not in line:
                continue
            parts = line.split("SMDDP-CHECK ", 1)[1].split(" ", 3)
            rank, name, status = int(parts[0]), parts[1], parts[2]
            self.checks[(rank, name)] = (status == "OK", parts[3] if len(parts) > 3 else "")
            self.check_lines[rank] = self.check_lines.get(rank, 0) + 1

    def failures(self):
        return ["rank %d %s: %s" % (r, n, d) for (r, n), (ok, d) in sorted(self.checks.items()) if not ok]

    def names(self, rank=0):
        return {n for (r, n) in self.checks if r == rank}

    def leftovers(self, wait_s=10.0):
        """Daemons of this job still running and segments of it still in /dev/shm, after
        giving the daemons wait_s to notice that the ranks are gone. The ranks must have said
        which daemon and job served them (SMDDP-JOB lines with a pid and a job id): without
        that there would be nothing to look for, and no leftovers would prove nothing."""
        assert set(self.jobs) == set(range(self.world)), "SMDDP-JOB from ranks %s of %d\n%s" % (
            sorted(self.jobs), self.world, self.output[-3000:])
        unknown = {r: j for r, j in self.jobs.items() if j[0] == "?" or j[1] <= 0}
        assert not unknown, "ranks that did not learn their job or daemon: %s" % unknown
        daemons = {pid for (_, pid, _) in self.jobs.values()}
        jobs = {job for (job, _, _) in self.jobs.values()}
        deadline = time.time() + wait_s
        while time.time() < deadline and any(pid_alive(p) for p in daemons):
            time.sleep(0.05)
        left = ["daemon pid %d still running" % p for p in sorted(daemons) if pid_alive(p)]
        for job in sorted(jobs):
            left += glob.glob("/dev/shm/smddp.%s.*" % job)
        return left

    def assert_launch_path(self):
        """Each rank reported the launch path its launcher stands for."""
        want = "1" if self.launcher == "smddprun" else "2"
        paths = {r: p for r, (_, _, p) in self.jobs.items()}
        assert paths and set(paths.values()) == {want}, "launch paths by rank %s, expected %s" % (paths, want)
        assert len({job for (job, _, _) in self.jobs.values()}) == 1, "ranks saw different jobs: %s" % self.jobs

    def assert_ok(self, min_checks=1, started=True):
        """The job passed, and every one of its ranks made at least min_checks checks (each
        rank's SMDDP-DONE line, matched by the SMDDP-CHECK lines read from it). started: the
        ranks joined a job (init_process_group returned), so each must have reported its job
        and launch path, and nothing of the job may be left; False for ranks whose init must fail."""
        tail = "\n".join(self.output.splitlines()[-60:])
        assert self.returncode == 0, "job exited with %d; failures: %s\n--- output tail ---\n%s" % (
            self.returncode, self.failures(), tail)
        assert not self.failures(), "failed checks:\n  " + "\n  ".join(self.failures())
        missing = [r for r in range(self.world) if r not in self.done]
        assert not missing, "ranks %s of %d wrote no SMDDP-DONE line\n%s" % (missing, self.world, tail)
        for r in range(self.world):
            made, failed = self.done[r]
            assert failed == 0, "rank %d says %d checks failed" % (r, failed)
            assert made >= min_checks, "rank %d made %d checks, expected at least %d\n%s" % (r, made, min_checks, tail)
            read = self.check_lines.get(r, 0)
            assert read == made, "rank %d made %d checks, %d were read" % (r, made, read)
        assert set(self.done) == set(range(self.world)), "SMDDP-DONE from ranks %s" % sorted(self.done)
        if not started:
            assert not self.jobs, "ranks joined a job though their init should have failed: %s" % self.jobs
            return
        self.assert_launch_path()
        left = self.leftovers()
        assert not left, "left behind after the job: %s" % left


def _worker_cmd(worker, args, python_args=()):
    return [python_exe(), *python_args, os.path.join(WORKERS, worker), *map(str, args)]


_TORCHRUN_PROBE = {}


def torchrun_broken():
    """None when torchrun (torch.distributed.run) can start a worker here, else why not.
    Debian's torch 1.13 torchrun dies under Python 3.11 before it starts any worker."""
    py = python_exe()
    if py not in _TORCHRUN_PROBE:
        try:
            proc = subprocess.run([py, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_addr",
                                   "127.0.0.1", "--master_port", str(free_port()), "--no_python", "echo",
                                   "SMDDP-TORCHRUN-OK"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, timeout=120)
            ok = proc.returncode == 0 and "SMDDP-TORCHRUN-OK" in proc.stdout
            last = (proc.stdout.strip().splitlines() or ["no output"])[-1]
        except (OSError, subprocess.TimeoutExpired) as e:
            ok, last = False, str(e)
        _TORCHRUN_PROBE[py] = None if ok else "torchrun cannot start a worker with %s: %s" % (py, last)
    return _TORCHRUN_PROBE[py]


def run_job(worker, nproc, args=(), timeout=240, extra_env=None, smddprun_args=(), launcher="smddprun",
            mpirun_args=(), python_args=()):
    """Runs `smddprun --nproc-per-node N -- python workers/<worker> ARGS` (launch path 1) or
    `mpirun -np N python workers/<worker> ARGS` (launch path 2) and returns a JobResult.
    python_args go before the script (e.g. ("-m", "mpi4py"))."""
    build = build_dir()
    env = base_env(build)
    if extra_env:
        env.update(extra_env)
    env["SMDDP_TEST_RECORDS"] = tempfile.mkdtemp(prefix="smddp-records-")
    if launcher == "smddprun":
        smddprun = os.path.join(build, "bin", "smddprun")
        if not os.access(smddprun, os.X_OK):
            pytest.skip("smddprun not found in %s/bin" % build)
        cmd = [smddprun, "--daemon", daemon_path(build), "--nproc-per-node", str(nproc), *smddprun_args, "--",
               *_worker_cmd(worker, args, python_args)]
    elif launcher == "mpirun":
        mpirun = shutil.which("mpirun")
        if not mpirun:
            pytest.skip("mpirun not found")
        env["SMDDP_DAEMON"] = daemon_path(build)
        env["MASTER_ADDR"] = "127.0.0.1"
        env["MASTER_PORT"] = str(free_port())
        forwarded = [a for name in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "OMP_NUM_THREADS", "SMDDP_DAEMON",
                                    "MASTER_ADDR", "MASTER_PORT", "SMDDP_TEST_RECORDS", *(extra_env or {}))
                     for a in ("-x", name)]
        cmd = [mpirun, *MPIRUN_FLAGS, *mpirun_args, *forwarded, "-np", str(nproc),
               *_worker_cmd(worker, args, python_args)]
    elif launcher == "torchrun":
        reason = torchrun_broken()
        if reason:
            pytest.skip(reason)
        env["SMDDP_DAEMON"] = daemon_path(build)
        cmd = [python_exe(), "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
               os.path.join(WORKERS, worker), *map(str, args)]
    else:
        raise ValueError(launcher)
    # --simulate-nodes K runs K nodes of nproc ranks each.
    sim = list(smddprun_args)
    world = nproc * (int(sim[sim.index("--simulate-nodes") + 1]) if "--simulate-nodes" in sim else 1)
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout, cwd=WORKERS)
    finally:
        records = read_records(env["SMDDP_TEST_RECORDS"])
    return JobResult(proc, launcher, time.time() - t0, records, world=world)


def run_plain(worker, args=(), env_overrides=None, timeout=120):
    """Runs one worker process without a launcher (no daemon unless the plugin starts one)."""
    build = build_dir()
    env = base_env(build)
    if env_overrides:
        env.update(env_overrides)
    env["SMDDP_TEST_RECORDS"] = tempfile.mkdtemp(prefix="smddp-records-")
    try:
        proc = subprocess.run(_worker_cmd(worker, args), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout, cwd=WORKERS)
    finally:
        records = read_records(env["SMDDP_TEST_RECORDS"])
    return JobResult(proc, "plain", records=records)
