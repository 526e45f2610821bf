"""Tests of smddprun: --help, the mpirun command it builds (--dry-run), usage errors, and one
real run against fake mpirun/daemon scripts (exit status, cleanup, signal forwarding).
No real MPI job is started and no host other than this one is contacted."""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import LAUNCHER_PYTHON, load_launcher_module, write_script

LOCAL_MCA = {
    "plm": "isolated",
    "pml": "ob1",
    "btl": "self,vader,tcp",
    "btl_vader_single_copy_mechanism": "none",
    "btl_tcp_if_include": "lo",
    "oob_tcp_if_include": "lo",
}


class Parsed:
    """A dry-run command split into mpirun options, daemon options and the training command."""

    def __init__(self, argv, daemon):
        self.argv = argv
        assert daemon in argv, "daemon %s missing from %s" % (daemon, argv)
        at = argv.index(daemon)
        self.mpirun = argv[0]
        self.mpi_opts = argv[1:at]
        rest = argv[at + 1:]
        assert "--" in rest, "no '--' before the training command: %s" % rest
        sep = rest.index("--")
        self.daemon_opts = rest[:sep]
        self.command = rest[sep + 1:]

    def values(self, flag, opts=None):
        opts = self.mpi_opts if opts is None else opts
        return [opts[i + 1] for i, word in enumerate(opts[:-1]) if word == flag]

    def value(self, flag, opts=None):
        found = self.values(flag, opts)
        assert len(found) == 1, "%s appears %d times in %s" % (flag, len(found), opts)
        return found[0]

    def daemon_value(self, flag):
        return self.value(flag, self.daemon_opts)

    @property
    def mca(self):
        opts = self.mpi_opts
        pairs = [(opts[i + 1], opts[i + 2]) for i, word in enumerate(opts[:-2]) if word == "--mca"]
        keys = [key for key, _ in pairs]
        assert len(keys) == len(set(keys)), "duplicate MCA keys: %s" % keys
        return dict(pairs)

    @property
    def exports(self):
        """-x entries as {NAME: VALUE or None}."""
        out = {}
        for item in self.values("-x"):
            name, sep, value = item.partition("=")
            assert name not in out, "-x %s given twice" % name
            out[name] = value if sep else None
        return out


def dry(run_launcher, tools, args, **kwargs):
    result = run_launcher(["--dry-run"] + list(args), **kwargs)
    assert result.returncode == 0, result.stderr
    return Parsed(result.argv, tools.daemon)


def expect_usage_error(run_launcher, args, pattern, **kwargs):
    result = run_launcher(args, **kwargs)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if "warning:" not in line]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("smddprun: error: ")
    assert re.search(pattern, lines[0]), "%r does not match %r" % (lines[0], pattern)
    return lines[0]


# ------------------------------------------------------------------------------------ help

HELP_FLAGS = ["-np", "--nodes", "--nproc-per-node", "-H", "--host", "--hostfile", "-x",
              "--mca", "--custom-mpi-options", "--config", "--set", "--dry-run",
              "--simulate-nodes", "--log-level", "--job-id", "--mpirun", "--daemon", "--help"]


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_mentions_every_flag(run_launcher, flag):
    result = run_launcher([flag])
    assert result.returncode == 0, result.stderr
    for name in HELP_FLAGS:
        assert re.search(r"(^|[\s,])%s([\s,]|$)" % re.escape(name), result.stdout, re.M), name
    for word in ("SMDDP_JOB_ID", "--bind-to none", "--cleanup-job", "SMDATAPARALLEL_OPTIMIZE_SDP"):
        assert word in result.stdout


def test_help_lists_every_option_the_parser_knows(run_launcher, module):
    text = run_launcher(["--help"]).stdout
    for opt in module.OPTIONS:
        for name in opt.names:
            assert name in text, name


# ------------------------------------------------------------------------- dry-run layouts

def test_default_single_node(run_launcher, tools, module):
    parsed = dry(run_launcher, tools, ["--", "python3", "train.py", "--lr", "0.1"])
    assert parsed.mpirun == tools.mpirun
    assert parsed.value("-np") == "1"
    assert "-H" not in parsed.mpi_opts and "--host" not in parsed.mpi_opts
    assert parsed.value("--bind-to") == "none"
    assert "--tag-output" not in parsed.argv
    assert parsed.mca == LOCAL_MCA
    expected_gpus = module.detect_gpu_count() or 1
    assert parsed.daemon_value("--nproc-per-node") == str(expected_gpus)
    assert "--simulate-nodes" not in parsed.daemon_opts
    assert parsed.command == ["python3", "train.py", "--lr", "0.1"]
    job_id = parsed.daemon_value("--job-id")
    assert re.match(r"^smddp-[0-9a-f]{8}$", job_id)
    assert parsed.exports["SMDDP_JOB_ID"] == job_id
    assert "PATH" in parsed.exports


def test_root_flag_matches_euid(run_launcher, tools):
    parsed = dry(run_launcher, tools, ["python3", "t.py"])
    assert ("--allow-run-as-root" in parsed.mpi_opts) == (os.geteuid() == 0)


def test_np_alone_is_ranks_on_one_node(run_launcher, tools):
    parsed = dry(run_launcher, tools, ["-np", "4", "--", "python3", "t.py"])
    assert parsed.value("-np") == "1"
    assert parsed.daemon_value("--nproc-per-node") == "4"


def test_nproc_per_node(run_launcher, tools):
    parsed = dry(run_launcher, tools, ["--nproc-per-node", "4", "--", "python3", "t.py"])
    assert parsed.value("-np") == "1"
    assert parsed.daemon_value("--nproc-per-node") == "4"


def test_np_and_nproc_per_node_agree(run_launcher, tools):
    parsed = dry(run_launcher, tools, ["-np=4", "--nproc-per-node=4", "python3", "t.py"])
    assert parsed.daemon_value("--nproc-per-node") == "4"


@pytest.mark.parametrize("extra,nproc", [([], None), (["-np", "4"], "2"),
                                         (["--nproc-per-node", "3"], "3")])
def test_simulate_nodes(run_launcher, tools, module, extra, nproc):
    parsed = dry(run_launcher, tools, ["--simulate-nodes", "2"] + extra + ["--", "python3", "t.py"])
    assert parsed.value("-np") == "2"
    assert "--oversubscribe" in parsed.mpi_opts
    assert "-H" not in parsed.mpi_opts
    assert parsed.mca == LOCAL_MCA
    assert parsed.daemon_value("--simulate-nodes") == "2"
    assert parsed.daemon_value("--nproc-per-node") == (nproc or str(module.detect_gpu_count() or 1))


def test_hosts_one_daemon_each(run_launcher, tools):
    parsed = dry(run_launcher, tools,
                 ["-H", "a,b", "--nproc-per-node", "8", "--", "python3", "t.py"])
    assert parsed.value("-np") == "2"
    assert parsed.value("-H") == "a:1,b:1"
    assert parsed.value("--map-by") == "ppr:1:node"
    assert parsed.value("--bind-to") == "none"
    assert parsed.daemon_value("--nproc-per-node") == "8"
    assert "--simulate-nodes" not in parsed.daemon_opts
    # Loopback-only defaults are for single-machine runs; they would break a real cluster.
    assert "btl_tcp_if_include" not in parsed.mca
    assert "oob_tcp_if_include" not in parsed.mca
    assert "plm" not in parsed.mca, "hosts are reached through ssh: the isolated launcher is local only"


def test_host_slots_give_nproc_and_nodes_takes_first_hosts(run_launcher, tools):
    parsed = dry(run_launcher, tools, ["-H", "a:4,b:4", "-H", "c:4", "--nodes", "2", "python3", "t.py"])
    assert parsed.value("-np") == "2"
    assert parsed.value("-H") == "a:1,b:1"
    assert parsed.daemon_value("--nproc-per-node") == "4"


def test_hosts_with_np(run_launcher, tools):
    parsed = dry(run_launcher, tools, ["--host", "a,b,c", "-np", "6", "python3", "t.py"])
    assert parsed.value("-np") == "3"
    assert parsed.daemon_value("--nproc-per-node") == "2"


def test_hostfile(run_launcher, tools):
    hostfile = tools.dir / "hosts"
    hostfile.write_text("# cluster\n\nnode1 slots=8   # first\n  node2 slots=8 max_slots=16\n")
    parsed = dry(run_launcher, tools, ["--hostfile", str(hostfile), "--", "python3", "t.py"])
    assert parsed.value("-np") == "2"
    assert parsed.value("-H") == "node1:1,node2:1"
    assert parsed.value("--map-by") == "ppr:1:node"
    assert parsed.daemon_value("--nproc-per-node") == "8"


def test_hostfile_without_slots_uses_nproc(run_launcher, tools):
    hostfile = tools.dir / "hosts"
    hostfile.write_text("node1\nnode2\nnode3\n")
    parsed = dry(run_launcher, tools, ["--hostfile", str(hostfile), "-np", "6", "python3", "t.py"])
    assert parsed.value("-H") == "node1:1,node2:1,node3:1"
    assert parsed.daemon_value("--nproc-per-node") == "2"


# ------------------------------------------------------------------- options passed along

def test_exports(run_launcher, tools):
    env = tools.base_env()
    env.update({"FOO": "from-env", "SMDDP_FOO": "1", "SMDDP_LOG_LEVEL": "warn",
                "SMDATAPARALLEL_OPTIMIZE_SDP": "true", "LD_LIBRARY_PATH": "/opt/lib",
                "PYTHONPATH": "/user/py", "UNRELATED": "x"})
    result = run_launcher(["--dry-run", "-x", "FOO", "-x", "BAR=baz qux", "-x=EMPTY=",
                           "--job-id", "job-1", "python3", "t.py"], env=env)
    assert result.returncode == 0, result.stderr
    parsed = Parsed(result.argv, tools.daemon)
    exports = parsed.exports
    assert exports["FOO"] is None            # mpirun takes the value from its environment
    assert exports["BAR"] == "baz qux"
    assert exports["EMPTY"] == ""
    assert exports["SMDDP_JOB_ID"] == "job-1"
    assert exports["SMDDP_FOO"] is None
    assert exports["SMDDP_LOG_LEVEL"] is None
    assert exports["SMDDP_MPIRUN"] is None   # every SMDDP_* variable travels
    assert exports["SMDATAPARALLEL_OPTIMIZE_SDP"] is None
    assert exports["LD_LIBRARY_PATH"] is None
    assert exports["PATH"] is None
    assert "/user/py" in exports["PYTHONPATH"].split(os.pathsep)
    assert "UNRELATED" not in exports
    # What the ranks get back after Open MPI put its own directories first.
    assert exports["SMDDP_RANK_PATH"] == env["PATH"]
    assert exports["SMDDP_RANK_LD_LIBRARY_PATH"] == "/opt/lib"


def test_the_ranks_path_follows_a_user_export_and_an_unset_library_path_stays_unset(run_launcher, tools):
    env = tools.base_env()
    env.pop("LD_LIBRARY_PATH", None)
    env["SMDDP_RANK_PATH"] = "/stale"  # a value left in the environment does not win
    result = run_launcher(["--dry-run", "-x", "PATH=/mine/bin:/usr/bin", "python3", "t.py"], env=env)
    assert result.returncode == 0, result.stderr
    exports = Parsed(result.argv, tools.daemon).exports
    assert exports["SMDDP_RANK_PATH"] == "/mine/bin:/usr/bin"
    assert "SMDDP_RANK_LD_LIBRARY_PATH" not in exports


def test_export_of_unset_variable_warns_and_is_dropped(run_launcher, tools):
    result = run_launcher(["--dry-run", "-x", "NOT_SET_ANYWHERE", "python3", "t.py"])
    assert result.returncode == 0
    assert "NOT_SET_ANYWHERE" in result.stderr and "warning" in result.stderr
    assert "NOT_SET_ANYWHERE" not in Parsed(result.argv, tools.daemon).exports


def test_user_export_overrides_forwarded_value(run_launcher, tools):
    parsed = dry(run_launcher, tools, ["-x", "SMDDP_JOB_ID=mine", "--job-id", "j", "python3", "t"])
    assert parsed.exports["SMDDP_JOB_ID"] == "mine"


def test_pythonpath_holds_the_package_first(run_launcher, tools, module):
    package_dir, _ = module.python_package_dir()
    env = tools.base_env()
    env["PYTHONPATH"] = "/user/a:/user/b"
    result = run_launcher(["--dry-run", "python3", "t.py"], env=env)
    assert result.returncode == 0
    parts = Parsed(result.argv, tools.daemon).exports["PYTHONPATH"].split(os.pathsep)
    if package_dir:
        assert parts == [package_dir, "/user/a", "/user/b"]
    else:
        assert parts == ["/user/a", "/user/b"]
        assert "smddp Python package not found" in result.stderr


def test_package_dir_prefers_build_tree(module, tmp_path):
    script = (tmp_path / "smddprun")
    text = open(module.__file__).read()
    build_py, source_py = tmp_path / "build-python", tmp_path / "source-python"
    source_py.mkdir()
    # Works on the source copy (placeholders) and on the configured copy alike.
    text = re.sub(r'(?m)^_CONFIGURED_BUILD_PYTHON_DIR = ".*"$',
                  "_CONFIGURED_BUILD_PYTHON_DIR = %r" % str(build_py), text, count=1)
    text = re.sub(r'(?m)^_CONFIGURED_SOURCE_PYTHON_DIR = ".*"$',
                  "_CONFIGURED_SOURCE_PYTHON_DIR = %r" % str(source_py), text, count=1)
    script.write_text(text)
    assert load_launcher_module(str(script)).python_package_dir()[0] == str(source_py)
    build_py.mkdir()
    assert load_launcher_module(str(script)).python_package_dir()[0] == str(build_py)


def test_mca_override(run_launcher, tools):
    parsed = dry(run_launcher, tools, ["--mca", "btl_tcp_if_include", "eth0", "--mca",
                                       "coll_tuned_use_dynamic_rules", "1", "python3", "t.py"])
    mca = parsed.mca
    assert mca["btl_tcp_if_include"] == "eth0"
    assert mca["coll_tuned_use_dynamic_rules"] == "1"
    assert mca["oob_tcp_if_include"] == "lo"
    assert mca["btl"] == "self,vader,tcp"


def test_custom_mpi_options(run_launcher, tools):
    parsed = dry(run_launcher, tools, ["--custom-mpi-options", "-verbose -x NCCL_DEBUG=VERSION "
                                       "--mca btl 'tcp,self'", "--", "python3", "t.py"])
    tail = parsed.mpi_opts[-6:]
    assert tail == ["-verbose", "-x", "NCCL_DEBUG=VERSION", "--mca", "btl", "tcp,self"]
    assert parsed.mca["btl"] == "tcp,self"   # the default btl is gone, not duplicated
    assert parsed.mca["btl_tcp_if_include"] == "lo"


def test_daemon_options(run_launcher, tools):
    config = tools.dir / "local.ini"
    config.write_text("[fabric]\nprovider=tcp\n")
    parsed = dry(run_launcher, tools, ["--config", str(config), "--log-level", "debug",
                                       "--set", "fabric.provider=tcp", "--set", "a.b=c=d",
                                       "--job-id", "j.1", "--", "python3", "-u", "t.py"])
    assert parsed.daemon_value("--config") == str(config)
    assert parsed.daemon_value("--log-level") == "debug"
    assert parsed.values("--set", parsed.daemon_opts) == ["fabric.provider=tcp", "a.b=c=d"]
    assert parsed.daemon_value("--job-id") == "j.1"
    assert parsed.exports["SMDDP_LOG_LEVEL"] == "debug"
    assert parsed.command == ["python3", "-u", "t.py"]


def test_command_without_double_dash_keeps_its_options(run_launcher, tools):
    parsed = dry(run_launcher, tools, ["-np", "2", "python3", "train.py", "-np", "9", "--", "x"])
    assert parsed.daemon_value("--nproc-per-node") == "2"
    assert parsed.command == ["python3", "train.py", "-np", "9", "--", "x"]


def test_config_path_made_absolute(launcher, tools, tmp_path):
    (tmp_path / "c.ini").write_text("")
    completed = subprocess.run([LAUNCHER_PYTHON, launcher, "--dry-run", "--config", "c.ini",
                                "python3", "t.py"],
                               cwd=str(tmp_path), env=tools.base_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, universal_newlines=True, check=False)
    assert completed.returncode == 0, completed.stderr
    parsed = Parsed(shlex.split(completed.stdout), tools.daemon)
    assert parsed.daemon_value("--config") == str(tmp_path / "c.ini")


# ---------------------------------------------------------------------------- root, job id

@pytest.mark.parametrize("euid", [0, 1000])
def test_root_flag_when_euid_0(module, tools, euid):
    plan = module.build_plan(["python3", "t.py"], tools.base_env(), euid, gpu_count_fn=lambda: 2)
    assert ("--allow-run-as-root" in plan.argv) == (euid == 0)
    if euid == 0:
        assert plan.argv[1] == "--allow-run-as-root"
    for name in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
        assert (plan.env.get(name) == "1") == (euid == 0)
    assert plan.nproc_per_node == 2


@pytest.mark.parametrize("job_id", ["a", "job_1.2-x", "x" * 48])
def test_valid_job_ids(run_launcher, tools, job_id):
    parsed = dry(run_launcher, tools, ["--job-id", job_id, "python3", "t.py"])
    assert parsed.daemon_value("--job-id") == job_id


def test_job_id_from_environment(run_launcher, tools):
    parsed = dry(run_launcher, tools, ["python3", "t.py"], extra_env={"SMDDP_JOB_ID": "envjob"})
    assert parsed.daemon_value("--job-id") == "envjob"
    assert parsed.exports["SMDDP_JOB_ID"] == "envjob"


def test_generated_job_ids_differ(run_launcher, tools):
    first = dry(run_launcher, tools, ["python3", "t.py"]).daemon_value("--job-id")
    second = dry(run_launcher, tools, ["python3", "t.py"]).daemon_value("--job-id")
    assert first != second


@pytest.mark.parametrize("job_id", ["", "x" * 49, "has space", "a/b", "job;rm", "ümlaut"])
def test_invalid_job_ids(run_launcher, job_id):
    expect_usage_error(run_launcher, ["--job-id", job_id, "python3", "t.py"], r"invalid job id")


def test_invalid_job_id_from_environment(run_launcher):
    line = expect_usage_error(run_launcher, ["python3", "t.py"], r"invalid job id",
                              extra_env={"SMDDP_JOB_ID": "bad/id"})
    assert "SMDDP_JOB_ID" in line


# --------------------------------------------------------------------------------- errors

ERROR_CASES = [
    ([], r"no command given"),
    (["-np", "4"], r"no command given"),
    (["-np", "4", "--"], r"no command given"),
    (["--bogus", "python3"], r"unknown option '--bogus'"),
    (["-np"], r"-np needs N"),
    (["-np", "zero", "python3"], r"-np must be a positive integer"),
    (["-np", "0", "python3"], r"-np must be a positive integer"),
    (["--simulate-nodes", "2", "-np", "3", "python3"], r"-np 3 is not a multiple of the 2 node"),
    (["-H", "a,b", "-np", "3", "python3"], r"not a multiple"),
    (["-np", "4", "--nproc-per-node", "3", "python3"], r"-np 4 != 1 node\(s\) x --nproc-per-node 3"),
    (["-H", "a", "--nodes", "2", "python3"], r"--nodes 2 but only 1 host"),
    (["--nodes", "2", "python3"], r"--nodes 2 needs 2 hosts.*--simulate-nodes 2"),
    (["--simulate-nodes", "2", "-H", "a,b", "python3"], r"cannot be combined with -H"),
    (["--simulate-nodes", "2", "--nodes", "3", "python3"], r"--nodes 3 disagrees"),
    (["-H", "a:8,b:4", "python3"], r"different slot counts"),
    (["-H", "a,a", "python3"], r"host a is listed twice"),
    (["-H", ":4", "python3"], r"no host name"),
    (["--config", "/nonexistent/smddp.ini", "python3"], r"config file not found"),
    (["--log-level", "loud", "python3"], r"--log-level 'loud'"),
    (["--set", "novalue", "python3"], r"SECTION.KEY=VALUE"),
    (["--set", "nosection=1", "python3"], r"SECTION.KEY=VALUE"),
    (["-x", "1BAD=2", "python3"], r"not an environment variable name"),
    (["--custom-mpi-options", "'unclosed", "python3"], r"--custom-mpi-options"),
    (["--dry-run=yes", "python3"], r"takes no value"),
    (["--mpirun", "/nonexistent/mpirun", "python3"], r"mpirun not found"),
    (["--daemon", "/nonexistent/smddp-daemon", "python3"], r"smddp-daemon not found"),
]


@pytest.mark.parametrize("args,pattern", ERROR_CASES)
def test_usage_errors(run_launcher, args, pattern):
    expect_usage_error(run_launcher, args, pattern)


@pytest.mark.parametrize("args,pattern", ERROR_CASES)
def test_usage_errors_in_dry_run_too(run_launcher, args, pattern):
    expect_usage_error(run_launcher, ["--dry-run"] + args, pattern)


def test_hosts_and_hostfile_together(run_launcher, tools):
    hostfile = tools.dir / "hosts"
    hostfile.write_text("a\n")
    expect_usage_error(run_launcher, ["-H", "b", "--hostfile", str(hostfile), "python3"],
                       r"not both")


def test_bad_hostfiles(run_launcher, tools):
    empty = tools.dir / "empty"
    empty.write_text("# nothing\n\n")
    expect_usage_error(run_launcher, ["--hostfile", str(empty), "python3"], r"lists no hosts")
    bad = tools.dir / "bad"
    bad.write_text("a slots=two\n")
    expect_usage_error(run_launcher, ["--hostfile", str(bad), "python3"], r"line 1: slots")
    expect_usage_error(run_launcher, ["--hostfile", str(tools.dir / "missing"), "python3"],
                       r"cannot read hostfile")


def test_mpirun_not_on_path(run_launcher, tools):
    env = tools.base_env()
    del env["SMDDP_MPIRUN"]
    env["PATH"] = str(tools.dir / "empty-bin")
    expect_usage_error(run_launcher, ["python3", "t.py"], r"mpirun not found on PATH", env=env)


def test_mpirun_found_on_path(run_launcher, tools):
    bin_dir = tools.dir / "bin"
    bin_dir.mkdir()
    mpirun = write_script(bin_dir / "mpirun", "#!/bin/sh\nexit 0\n")
    env = tools.base_env()
    del env["SMDDP_MPIRUN"]
    env["PATH"] = str(bin_dir) + os.pathsep + env["PATH"]
    parsed = dry(run_launcher, tools, ["python3", "t.py"], env=env)
    assert parsed.mpirun == mpirun


def test_mpirun_flag_beats_environment(run_launcher, tools):
    other = write_script(tools.dir / "other-mpirun", "#!/bin/sh\nexit 0\n")
    parsed = dry(run_launcher, tools, ["--mpirun", other, "python3", "t.py"])
    assert parsed.mpirun == other


def test_daemon_found_beside_the_script(run_launcher, tools, launcher):
    bin_dir = tools.dir / "bin"
    bin_dir.mkdir()
    script = bin_dir / "smddprun"
    shutil.copy(launcher, str(script))
    daemon = write_script(bin_dir / "smddp-daemon", "#!/bin/sh\nexit 0\n")
    env = tools.base_env()
    del env["SMDDP_DAEMON"]
    result = run_launcher(["--dry-run", "python3", "t.py"], env=env, script=str(script))
    assert result.returncode == 0, result.stderr
    assert Parsed(result.argv, daemon).command == ["python3", "t.py"]


def test_daemon_missing(run_launcher, tools, launcher):
    lonely = tools.dir / "lonely"
    lonely.mkdir()
    script = lonely / "smddprun"
    shutil.copy(launcher, str(script))
    env = tools.base_env()
    del env["SMDDP_DAEMON"]
    env["PATH"] = os.path.dirname(tools.mpirun) + os.pathsep + "/usr/bin:/bin"
    expect_usage_error(run_launcher, ["python3", "t.py"], r"smddp-daemon not found next to",
                       env=env, script=str(script))


# ---------------------------------------------------------------------- discovery helpers

def test_gpu_count_from_proc(module, tmp_path):
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    for bus in ("0000:19:00.0", "0000:3b:00.0", "0000:4c:00.0"):
        (gpus / bus).mkdir()
    assert module.detect_gpu_count(proc_dir=str(gpus), nvidia_smi=str(tmp_path / "none")) == 3


def test_gpu_count_from_nvidia_smi(module, tmp_path):
    smi = write_script(tmp_path / "nvidia-smi", "#!/bin/sh\n"
                       "echo 'GPU 0: NVIDIA H200 (UUID: GPU-1)'\n"
                       "echo '  MIG 1g.18gb Device 0: (UUID: MIG-1)'\n"
                       "echo 'GPU 1: NVIDIA H200 (UUID: GPU-2)'\n")
    assert module.detect_gpu_count(proc_dir=str(tmp_path / "no-proc"), nvidia_smi=smi) == 2


def test_no_gpu_defaults_to_one_rank(module, tools):
    plan = module.build_plan(["python3", "t.py"], tools.base_env(), 1000, gpu_count_fn=lambda: 0)
    assert plan.nproc_per_node == 1


def test_built_copy_is_configured(launcher):
    if not os.environ.get("SMDDP_BIN_DIR"):
        pytest.skip("testing the source copy (SMDDP_BIN_DIR not set)")
    text = open(launcher).read()
    assert "@SMDDP_BUILD_PYTHON_DIR@" not in text
    assert "@SMDDP_SOURCE_PYTHON_DIR@" not in text
    assert os.access(launcher, os.X_OK)


# ---------------------------------------------------------------------------- real runs

def test_runs_mpirun_propagates_status_and_cleans_up(run_launcher, tools):
    result = run_launcher(["--job-id", "runjob", "-np", "2", "--", "python3", "t.py", "a b"])
    assert result.returncode == 3, result.stderr
    recorded = tools.mpirun_record.read_text().splitlines()
    parsed = Parsed([tools.mpirun] + recorded, tools.daemon)
    assert parsed.daemon_value("--job-id") == "runjob"
    assert parsed.daemon_value("--nproc-per-node") == "2"
    assert parsed.command == ["python3", "t.py", "a b"]
    assert tools.daemon_record.read_text().splitlines() == ["--cleanup-job", "runjob"]


def test_executable_via_shebang(tools, launcher):
    assert os.access(launcher, os.X_OK)
    assert open(launcher).readline().strip() == "#!/usr/bin/env python3"
    completed = subprocess.run([launcher, "--job-id", "shebang", "python3", "t.py"],
                               env=tools.base_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, universal_newlines=True, check=False)
    assert completed.returncode == 3, completed.stderr
    assert tools.daemon_record.read_text().splitlines() == ["--cleanup-job", "shebang"]


def test_status_zero_and_cleanup_failure_is_only_a_warning(run_launcher, tools):
    mpirun = write_script(tools.dir / "ok-mpirun", "#!/bin/sh\nexit 0\n")
    daemon = write_script(tools.dir / "bad-daemon", "#!/bin/sh\nexit 5\n")
    result = run_launcher(["--mpirun", mpirun, "--daemon", daemon, "--job-id", "j", "python3"])
    assert result.returncode == 0
    assert "warning" in result.stderr and "--cleanup-job j" in result.stderr


def test_mpirun_environment(run_launcher, tools):
    mpirun = write_script(tools.dir / "env-mpirun",
                          "#!/bin/sh\nenv > '%s'\nexit 0\n" % (tools.dir / "mpirun.env"))
    result = run_launcher(["--mpirun", mpirun, "--job-id", "envjob", "python3"])
    assert result.returncode == 0, result.stderr
    env = dict(line.split("=", 1) for line in (tools.dir / "mpirun.env").read_text().splitlines()
               if "=" in line)
    assert env["SMDDP_JOB_ID"] == "envjob"
    if os.geteuid() == 0:
        assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
        assert env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_is_forwarded_then_cleanup(launcher, tools, signum):
    ready = tools.dir / "ready"
    got = tools.dir / "got-signal"
    # The fake mpirun records the signal, then dies of it (default action).
    mpirun = write_script(tools.dir / "sleepy-mpirun", """#!%s
import os, signal, time
def handler(signum, frame):
    open(%r, "w").write(str(signum))
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
signal.signal(signal.SIGTERM, handler)
signal.signal(signal.SIGINT, handler)
open(%r, "w").write("up")
while True:
    time.sleep(60)
""" % (sys.executable, str(got), str(ready)))
    proc = subprocess.Popen([LAUNCHER_PYTHON, launcher, "--mpirun", mpirun, "--job-id", "sig",
                             "python3", "t.py"], env=tools.base_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "fake mpirun never started"
            time.sleep(0.05)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert got.read_text() == str(int(signum))
    assert proc.returncode == 128 + int(signum), err
    assert tools.daemon_record.read_text().splitlines() == ["--cleanup-job", "sig"]


def _fake_mpirun_with_daemon(tools, daemon, job_id, mpirun_outlives_s):
    """A fake mpirun whose child looks like the job's daemon (argv[0] the daemon, --job-id ID),
    lives 0.3 s, and after which mpirun lingers for mpirun_outlives_s (a host it cannot reach)."""
    return write_script(tools.dir / "lingering-mpirun", """#!/bin/bash
(exec -a %s %s -c 'import time; time.sleep(0.3)' --job-id %s)
sleep %s
exit 4
""" % (shlex.quote(daemon), shlex.quote(sys.executable), job_id, mpirun_outlives_s))


def _plan(module, daemon, job_id, hosts):
    return module.Plan(["mpirun"], {}, job_id, daemon, len(hosts) or 1, 1, False, hosts=hosts)


def test_across_hosts_a_mpirun_that_outlives_its_daemon_is_killed(module, tools, capsys):
    mpirun = _fake_mpirun_with_daemon(tools, tools.daemon, "linger", 60)
    proc = subprocess.Popen([mpirun])
    t0 = time.monotonic()
    rc = module.wait_for_mpirun(proc, _plan(module, tools.daemon, "linger", ["h1", "h2"]), grace_s=1.0, poll_s=0.05)
    assert rc != 0
    assert time.monotonic() - t0 < 10
    err = capsys.readouterr().err
    assert "mpirun has not ended 1 s after this machine's smddp daemon exited" in err, err
    assert "h1, h2" in err and "linger" in err


def test_a_mpirun_that_ends_after_its_daemon_is_waited_for(module, tools, capsys):
    mpirun = _fake_mpirun_with_daemon(tools, tools.daemon, "ends", 0.5)
    for hosts in (["h1", "h2"], []):  # across hosts, and on one machine (never killed)
        proc = subprocess.Popen([mpirun])
        assert module.wait_for_mpirun(proc, _plan(module, tools.daemon, "ends", hosts), grace_s=5.0, poll_s=0.05) == 4
    assert "mpirun has not ended" not in capsys.readouterr().err
