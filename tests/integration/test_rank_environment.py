"""The ranks' PATH and LD_LIBRARY_PATH under smddprun are the user's: Open MPI, given mpirun by
its path, puts its own bin and lib first in its daemons' (so `python3` would be the system's,
not a virtualenv's, and /usr/lib would come before a conda environment's libraries)."""
import os
import subprocess

from conftest import REPO, bin_dir


def test_ranks_run_the_program_first_in_the_users_path_with_the_users_library_path(tmp_path):
    programs = tmp_path / "bin"
    programs.mkdir()
    # Named as a program of /usr/bin, as python3 is: the rank must run this one.
    fake = programs / "printenv"
    fake.write_text('#!/bin/sh\necho "$PATH" > "%s/rank.$RANK.path"\n'
                    'echo "${LD_LIBRARY_PATH-<unset>}" > "%s/rank.$RANK.libs"\n' % (tmp_path, tmp_path))
    fake.chmod(0o755)
    sockets = tmp_path / "sockets"
    sockets.mkdir(mode=0o700)
    env = dict(os.environ, PATH="%s:%s" % (programs, os.environ["PATH"]), SMDDP_SOCKET_DIR=str(sockets))
    for libs in (None, "/opt/smddp-test-libs"):
        if libs is None:
            env.pop("LD_LIBRARY_PATH", None)
        else:
            env["LD_LIBRARY_PATH"] = libs
        r = subprocess.run([str(bin_dir() / "smddprun"), "--nproc-per-node", "2",
                            "--config", str(REPO / "configs" / "local.ini"), "--", "printenv"],
                           env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        assert r.returncode == 0, r.stdout[-3000:]
        for rank in range(2):
            path_file = tmp_path / ("rank.%d.path" % rank)
            assert path_file.exists(), "rank %d ran another printenv than the user's\n%s" % (rank, r.stdout[-3000:])
            dirs = path_file.read_text().strip().split(":")
            # A launcher in between (pyenv's shim, say) may put its own folders first; Open MPI's
            # /usr/bin must not come before the user's.
            assert str(programs) in dirs, dirs
            if "/usr/bin" in dirs:
                assert dirs.index(str(programs)) < dirs.index("/usr/bin"), dirs
            got = (tmp_path / ("rank.%d.libs" % rank)).read_text().strip()
            assert got == (libs or "<unset>"), "rank %d's LD_LIBRARY_PATH: %r, the user's: %r" % (rank, got, libs)
            path_file.unlink()
