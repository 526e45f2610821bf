"""Isolation between jobs and users on one machine: two jobs at once run and fail independently;
a process of another uid can neither open a job's shared segment nor get an answer from its
daemon's control socket; a killed job's leftovers are removed by the next job's daemon."""
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from conftest import Job
from test_failures import results, wait_for_files


def wait_for(pred, what, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def test_two_jobs_run_and_fail_independently(tmp_path):
    # Job A idles between its ranks' attach and a closing barrier; job B loses a rank meanwhile.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = Job(tmp_path / "a"), Job(tmp_path / "b")
    proc_a = a.start(2, "failure_worker", "--mode", "idle", "--seconds", 4)
    proc_b = b.start(2, "failure_worker", "--mode", "stuck", "--victim", 1, "--dir", b.dir)
    try:
        wait_for_files([b.dir / "ready.0", b.dir / "victim.pid"])
        time.sleep(0.5)  # rank 0 of B is inside its allreduce
        victim = int((b.dir / "victim.pid").read_text())
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        out_b, _ = proc_b.communicate(timeout=60)
        out_a, _ = proc_a.communicate(timeout=60)
    finally:
        for p in (proc_a, proc_b):
            if p.poll() is None:
                p.kill()
    assert proc_b.returncode != 0, out_b[-3000:]
    res = results(out_b)
    assert sorted(res) == [0], out_b[-3000:]
    at, msg = res[0]
    assert at - killed_at < 5.0 and f"rank 1 (pid {victim})" in msg, msg
    assert proc_a.returncode == 0, "job A failed with job B:\n" + out_a[-3000:]
    assert a.id not in out_b and b.id not in out_a, "one job's output names the other"
    assert a.leftovers() == [] and b.leftovers() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user (runuser)")
def test_other_user_can_neither_open_the_segment_nor_ask_the_daemon(tmp_path):
    runuser = shutil.which("runuser")
    assert runuser, "runuser (util-linux) is missing"
    other = ["nobody"]
    assert subprocess.run(["id", *other], stdout=subprocess.DEVNULL).returncode == 0, "no user 'nobody'"
    # A socket folder that the other user can reach once the daemon made its socket in it (the
    # daemon refuses to start in one that others can enter): what answers then is the daemon's
    # own check of its client's uid.
    sockets = pathlib.Path(tempfile.mkdtemp(prefix="smddp-iso-"))
    job = Job(tmp_path)
    job.sockets = sockets
    job.env["SMDDP_SOCKET_DIR"] = str(sockets)
    proc = job.start(2, "failure_worker", "--mode", "idle", "--seconds", 5)
    try:
        segment = pathlib.Path("/dev/shm") / f"smddp.{job.id}.n0"
        sock = sockets / f"{job.id}.n0.sock"
        wait_for(lambda: segment.exists() and sock.exists(), "the job's segment and control socket")
        os.chmod(sockets, 0o711)
        os.chmod(sock, 0o777)
        probe = r"""
import socket, sys
what = sys.argv[1]
if what == "segment":
    try:
        open(sys.argv[2], "r+b")
    except PermissionError as e:
        print("REFUSED", e)
        sys.exit(0)
    print("OPENED")
    sys.exit(1)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
s.connect(sys.argv[2])
reply = b""
try:  # the daemon may close the connection before the request is even sent
    s.sendall(b"status\n")
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        reply += chunk
except (BrokenPipeError, ConnectionResetError) as e:
    print("CLOSED", e)
print("REPLY", len(reply), reply[:200])
sys.exit(0 if not reply else 1)
"""
        seg = subprocess.run([runuser, "-u", other[0], "--", "/usr/bin/python3", "-c", probe, "segment", str(segment)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
        assert seg.returncode == 0 and "REFUSED" in seg.stdout, "another user opened the segment: " + seg.stdout
        ctl = subprocess.run([runuser, "-u", other[0], "--", "/usr/bin/python3", "-c", probe, "socket", str(sock)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
        assert ctl.returncode == 0 and "REPLY 0" in ctl.stdout, "the daemon answered another user: " + ctl.stdout
        # The job's own user still gets its answer.
        own = subprocess.run([str(pathlib.Path(job.argv(1, "x")[0]).parent / "smddp-ctl"), "status", "--job", job.id],
                             env=job.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
        assert own.returncode == 0 and job.id in own.stdout, own.stdout
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        socket_left = sock.exists()
        shutil.rmtree(sockets, ignore_errors=True)
    assert proc.returncode == 0, out[-3000:]
    assert "refused a client of uid" in out, "the daemon did not log the refusal:\n" + out[-3000:]
    assert not list(pathlib.Path("/dev/shm").glob(f"smddp.{job.id}.*")), "the job left its segment behind"
    assert not socket_left, "the job left its control socket behind"


def process_tree(root):
    """root and every process below it, deepest first."""
    children = {}
    for line in subprocess.run(["ps", "-e", "-o", "pid=,ppid="], stdout=subprocess.PIPE, text=True).stdout.splitlines():
        pid, ppid = map(int, line.split())
        children.setdefault(ppid, []).append(pid)
    order, todo = [], [root]
    while todo:
        p = todo.pop()
        order.append(p)
        todo.extend(children.get(p, []))
    return order[::-1]


def test_a_killed_jobs_segment_is_removed_by_the_next_job_and_never_attached(tmp_path):
    # A job killed outright (launcher, mpirun, daemon and ranks at once, as by the OOM killer or
    # a scheduler's SIGKILL) leaves its segment and control socket; nothing of it runs to clean up.
    (tmp_path / "dead").mkdir()
    (tmp_path / "next").mkdir()
    dead = Job(tmp_path / "dead")
    proc = subprocess.Popen(dead.argv(2, "failure_worker", "--mode", "idle", "--seconds", 60), env=dead.env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    segment = pathlib.Path("/dev/shm") / f"smddp.{dead.id}.n0"
    sock = dead.sockets / f"{dead.id}.n0.sock"
    try:
        wait_for(lambda: segment.exists() and sock.exists() and len(process_tree(proc.pid)) >= 5,
                 "the job's segment, socket, daemon and ranks")
        time.sleep(0.5)  # both ranks attached
        tree = process_tree(proc.pid)
        for pid in tree:  # stopped first, so that no rank sees its daemon die and cleans up after it
            os.kill(pid, signal.SIGSTOP)
        for pid in tree:
            os.kill(pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert segment.exists() and sock.exists(), "the killed job should have left its segment and socket"
    # The next job of this user on this machine (another job id, the same socket folder) removes
    # them as its daemon starts, and runs.
    nxt = Job(tmp_path / "next")
    nxt.sockets, nxt.env = dead.sockets, dead.env
    r = nxt.run(2, "failure_worker", "--mode", "idle", "--seconds", 0, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:]
    assert f"removed /dev/shm/smddp.{dead.id}.n0, left by daemon pid" in r.stdout, r.stdout[-3000:]
    assert not segment.exists() and not sock.exists(), "the killed job's segment or socket is still there"
    assert nxt.leftovers() == []
