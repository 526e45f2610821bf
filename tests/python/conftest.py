"""Shared fixtures of the plugin tests: where the build is, and how to run an smddp job.

Environment: SMDDP_BUILD_DIR (set by CTest; default: the newest build-* folder beside the
sources that has the extension), SMDDP_DAEMON (default <build>/bin/smddp-daemon),
SMDDP_TEST_PYTHON (default /usr/bin/python3).
"""

import glob
import os
import subprocess
import sys

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
                 "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


class JobResult:
    def __init__(self, proc):
        self.returncode = proc.returncode
        self.output = proc.stdout
        self.checks = {}  # (rank, name) -> (ok, detail)
        for line in self.output.splitlines():
            if "SMDDP-CHECK " not in line:
                continue
            parts = line.split("SMDDP-CHECK ", 1)[1].split(" ", 3)
            rank, name, status = int(parts[0]), parts[1], parts[2]
            self.checks[(rank, name)] = (status == "OK", parts[3] if len(parts) > 3 else "")

    def failures(self):
        return ["rank %d %s: %s" % (r, n, d) for (r, n), (ok, d) in sorted(self.checks.items()) if not ok]

    def names(self, rank=0):
        return {n for (r, n) in self.checks if r == rank}

    def assert_ok(self, min_checks=1):
        tail = "\n".join(self.output.splitlines()[-60:])
        assert self.returncode == 0, "job exited with %d; failures: %s\n--- output tail ---\n%s" % (
            self.returncode, self.failures(), tail)
        assert not self.failures(), "failed checks:\n  " + "\n  ".join(self.failures())
        assert len(self.checks) >= min_checks, "only %d checks reported\n%s" % (len(self.checks), tail)


def run_job(worker, nproc, args=(), timeout=240, extra_env=None, smddprun_args=()):
    """Runs `smddprun --nproc-per-node N -- python workers/<worker> ARGS` and returns a JobResult."""
    build = build_dir()
    smddprun = os.path.join(build, "bin", "smddprun")
    if not os.access(smddprun, os.X_OK):
        pytest.skip("smddprun not found in %s/bin" % build)
    cmd = [smddprun, "--daemon", daemon_path(build),
           "--nproc-per-node", str(nproc), *smddprun_args, "--",
           python_exe(), os.path.join(WORKERS, worker), *map(str, args)]
    env = base_env(build)
    if extra_env:
        env.update(extra_env)
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, cwd=WORKERS)
    return JobResult(proc)


def run_plain(worker, args=(), env_overrides=None, timeout=120):
    """Runs one worker process without smddprun (no daemon)."""
    build = build_dir()
    env = base_env(build)
    if env_overrides:
        env.update(env_overrides)
    proc = subprocess.run([python_exe(), os.path.join(WORKERS, worker), *map(str, args)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, cwd=WORKERS)
    return JobResult(proc)
