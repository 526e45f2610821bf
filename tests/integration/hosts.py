"""A bed of K hosts made of Linux namespaces (scripts/hosts.sh) for the tests across hosts: each
its own network (eth0 on a bridge of its own, no route out), /dev/shm, /tmp and host name.
mpirun reaches them through `scripts/hosts.sh agent`, so smddprun -H and --hostfile run as a
user would run them. Needs root; without it the tests fail saying so (they do not skip)."""
import os
import pathlib
import subprocess
import tempfile
import time

from conftest import REPO, bin_dir

HOSTS_SH = REPO / "scripts" / "hosts.sh"


def _sh(*argv, timeout=60):
    return subprocess.run([str(HOSTS_SH), *argv], text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=timeout)


class Bed:
    def __init__(self, k):
        if os.geteuid() != 0:
            raise AssertionError("the tests across hosts make network, mount and UTS namespaces: run them as root")
        r = _sh("up", str(k))
        assert r.returncode == 0, "scripts/hosts.sh up %d failed:\n%s" % (k, r.stdout)
        self.names = r.stdout.split()
        assert len(self.names) == k, r.stdout
        self.entries = {}
        for line in _sh("list").stdout.splitlines():
            name, addr, pid = line.split()
            self.entries[name] = (addr, int(pid))
        # Files every host sees (only /tmp and /dev/shm are private to each).
        self.shared = pathlib.Path(tempfile.mkdtemp(prefix="smddp-hosts-", dir="/var/tmp"))

    def address(self, name):
        return self.entries[name][0]

    def env(self, extra=None):
        env = dict(os.environ, OMPI_MCA_plm_rsh_agent="%s agent" % HOSTS_SH)
        for name in ("XDG_RUNTIME_DIR", "SMDDP_SOCKET_DIR"):  # each host's own /tmp/smddp-UID
            env.pop(name, None)
        env.update(extra or {})
        return env

    def argv_on(self, host, argv):
        return [str(HOSTS_SH), "exec", host, *map(str, argv)]

    def run_on(self, host, argv, timeout=120, env=None):
        return subprocess.run(self.argv_on(host, argv), env=self.env(env), text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout)

    def smddprun_argv(self, nproc, program, *args, hosts=None, hostfile=False, extra=(), command=None):
        """smddprun -H (or --hostfile) ... -- bin/PROGRAM ARGS, or -- COMMAND when given."""
        hosts = hosts or self.names
        if hostfile:
            path = self.shared / "hostfile"
            path.write_text("".join("%s slots=%d\n" % (h, nproc) for h in hosts))
            where = ["--hostfile", str(path)]
        else:
            where = ["-H", ",".join(hosts)]
        command = command or [bin_dir() / program, *args]
        return [bin_dir() / "smddprun", *where, "--nproc-per-node", nproc, *extra, "--", *command]

    def smddprun(self, nproc, program, *args, hosts=None, hostfile=False, extra=(), timeout=600):
        """Runs smddprun on the first host, as a user logged in there would."""
        argv = self.smddprun_argv(nproc, program, *args, hosts=hosts, hostfile=hostfile, extra=extra)
        return self.run_on((hosts or self.names)[0], argv, timeout=timeout)

    def start_smddprun(self, nproc, program, *args, extra=()):
        """Starts smddprun on the first host, its output into a file (proc.output): mpirun's
        remote-shell agents hold a pipe open as long as a host they reach lives on."""
        argv = self.smddprun_argv(nproc, program, *args, extra=extra)
        output = self.shared / "smddprun.out"
        with open(output, "w") as out:
            proc = subprocess.Popen(self.argv_on(self.names[0], argv), env=self.env(), text=True,
                                    stdout=out, stderr=subprocess.STDOUT)
        proc.output = output
        return proc

    def processes(self, name):
        """Pids in the host's network namespace other than its holder: what a job left running."""
        out = subprocess.run(["ip", "netns", "pids", name], text=True, stdout=subprocess.PIPE).stdout.split()
        holder = self.entries[name][1]
        return [int(p) for p in out if int(p) != holder]

    def leftovers(self, wait_s=10.0):
        """Processes, segments and sockets left on any host, after giving them wait_s to go."""
        deadline = time.time() + wait_s
        while True:
            left = {}
            for name in self.names:
                procs = self.processes(name)
                files = self.run_on(name, ["sh", "-c", "ls /dev/shm; ls /tmp/smddp-%d 2>/dev/null; true" % os.getuid()])
                if procs or files.stdout.split():
                    left[name] = {"processes": [_describe(p) for p in procs], "files": files.stdout.split()}
            if not left or time.time() > deadline:
                return left
            time.sleep(0.2)

    def down(self):
        r = _sh("down")
        names = subprocess.run(["ip", "netns", "list"], text=True, stdout=subprocess.PIPE).stdout
        subprocess.run(["rm", "-rf", str(self.shared)])
        assert r.returncode == 0, r.stdout
        assert "smddp-" not in names, "namespaces left after scripts/hosts.sh down:\n" + names


def _describe(pid):
    try:
        return "%d %s" % (pid, pathlib.Path("/proc/%d/cmdline" % pid).read_text().replace("\0", " ")[:120])
    except OSError:
        return str(pid)
