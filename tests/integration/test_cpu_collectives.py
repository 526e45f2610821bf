"""Every collective and dtype on host tensors, through smddprun with one daemon."""
import os
import re

import pytest

from conftest import bin_dir


def assert_all_ranks_passed(out, nproc):
    summaries = re.findall(r"rank (\d+): (\d+) cases, (\d+) failed", out)
    assert len(summaries) == nproc, out[-4000:]
    for rank, cases, failed in summaries:
        assert int(cases) > 0 and int(failed) == 0, out[-4000:]


@pytest.mark.parametrize("nproc", [2, 4])
def test_every_collective_small_sizes(job, nproc):
    # Sizes 0, 1, 7 and 1 MiB + 3 elements (the checker's defaults), every dtype and reduce op,
    # plus a communicator of ranks {0, 2}.
    r = job.run(nproc, "collective_check", "--subgroup")
    assert r.returncode == 0, r.stdout[-4000:]
    assert_all_ranks_passed(r.stdout, nproc)


@pytest.mark.parametrize("nproc", [2, 3])
def test_every_collective_on_both_sides_of_the_host_fast_path_boundary(job, nproc):
    # 1 KiB fast cells: a whole cell is 1024 / (element size) elements, and reduce_scatter,
    # scatter and alltoall carry n blocks of the count. These sizes put every dtype and
    # collective on both sides of that boundary, in the world and in a subgroup.
    sizes = sorted({c + d for e in (1, 2, 4, 8) for n in (1, nproc) for c in [1024 // e // n] for d in (0, 1)})
    r = job.run(nproc, "collective_check", "--subgroup", "--sizes", ",".join(map(str, sizes)),
                extra=["--set", "daemon.host_fast_kib=1"])
    assert r.returncode == 0, r.stdout[-4000:]
    assert_all_ranks_passed(r.stdout, nproc)
    total, fast, _ = fast_path_counts(r.stdout)
    assert 0 < fast < total, (total, fast)


def fast_path_counts(out):
    # The daemon's last line: all collectives, those on the host fast path, those by single copy.
    m = re.search(r"(\d+) collectives \((\d+) on the ranks' host fast path, (\d+) of them by single copy\)", out)
    assert m, out[-4000:]
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


@pytest.mark.parametrize("nproc", [2, 3])
def test_every_collective_on_both_sides_of_the_single_copy_boundary(job, nproc):
    # From 1 KiB of largest input the byte-moving collectives take the host fast path by single
    # copy (the members read each other's inputs with process_vm_readv), at any size: the 1 MiB +
    # 3 elements of the checker's default sizes too. Reductions of those sizes do not.
    sizes = sorted({c + d for e in (1, 2, 4, 8) for n in (1, nproc) for c in [1024 // e // n] for d in (-1, 0)})
    r = job.run(nproc, "collective_check", "--subgroup", "--sizes", ",".join(map(str, sizes + [(1 << 20) + 3])),
                extra=["--set", "daemon.host_single_copy_kib=1"])
    assert r.returncode == 0, r.stdout[-4000:]
    assert_all_ranks_passed(r.stdout, nproc)
    if "host collectives by single copy are off" in r.stdout:
        pytest.skip("this system refuses process_vm_readv: " + r.stdout.split("single copy are off: ")[1][:200])
    total, fast, single = fast_path_counts(r.stdout)
    assert 0 < single < fast < total, (total, fast, single)
    # Every rank's last requests were matched before its exit was judged.
    assert "while others wait for it" not in r.stdout, r.stdout[-4000:]


def test_single_copy_reads_split_over_helper_threads(job):
    # SMDDP_COPY_THREADS=3: each rank splits a single-copy read of at least 2 MiB over itself and
    # two helpers (client/copy_pool.hpp); 12 MiB + 20 bytes of float32 and 3 MiB + 5 of int8 a
    # rank cut the parts across the members' blocks and within pages.
    r = job.run(2, "collective_check", "--sizes", str((3 << 20) + 5), "--dtypes", "float32,int8",
                extra=["-x", "SMDDP_COPY_THREADS=3"])
    assert r.returncode == 0, r.stdout[-4000:]
    assert_all_ranks_passed(r.stdout, 2)
    if "host collectives by single copy are off" in r.stdout:
        pytest.skip("this system refuses process_vm_readv: " + r.stdout.split("single copy are off: ")[1][:200])
    _, _, single = fast_path_counts(r.stdout)
    assert single > 0, r.stdout[-4000:]


def test_host_copies_split_over_helper_threads(job):
    # SMDDP_COPY_THREADS=3 with 4 ranks, 1 MiB + 12 bytes of float32 and 256 KiB + 3 of int8 a
    # rank: chunks staged into the arenas, shares reduced and copied out, reads from the arenas
    # (float32) and from the fast cells (int8) in 64 KiB parts over the rank and two helpers
    # (client/copy_pool.hpp), cut across the members' blocks; then 2 ranks' all-reduce by single
    # copy of 4 MiB, whose 2 MiB shares are reduced and read in parts.
    r = job.run(4, "collective_check", "--sizes", str((1 << 18) + 3), "--dtypes", "float32,int8",
                extra=["-x", "SMDDP_COPY_THREADS=3"])
    assert r.returncode == 0, r.stdout[-4000:]
    assert_all_ranks_passed(r.stdout, 4)
    r = job.run(2, "collective_check", "--sizes", str(1 << 20), "--dtypes", "float32",
                extra=["-x", "SMDDP_COPY_THREADS=3"])
    assert r.returncode == 0, r.stdout[-4000:]
    assert_all_ranks_passed(r.stdout, 2)


def test_a_bad_copy_threads_value_is_named(job):
    r = job.run(2, "collective_check", "--sizes", "7", extra=["-x", "SMDDP_COPY_THREADS=lots"])
    assert r.returncode != 0
    assert "SMDDP_COPY_THREADS=lots" in r.stdout, r.stdout[-4000:]


def test_every_collective_64_mib(job):
    # A float type, a half type (float32 accumulation) and an integer type: each takes its own
    # reduction loop. The small sizes above run all nine; all nine at 64 MiB are the long run's.
    r = job.run(4, "collective_check", "--sizes", "7", "--big-bytes", 64 << 20, "--dtypes", "float32,bfloat16,int64")
    assert r.returncode == 0, r.stdout[-4000:]
    assert_all_ranks_passed(r.stdout, 4)


@pytest.mark.skipif(os.environ.get("SMDDP_LONG_TESTS") != "1",
                    reason="long run (all nine dtypes at 64 MiB, about ten minutes): scripts/test.sh --long")
def test_every_collective_64_mib_all_dtypes(job):
    r = job.run(4, "collective_check", "--sizes", "7", "--big-bytes", 64 << 20, timeout=1800)
    assert r.returncode == 0, r.stdout[-4000:]
    assert_all_ranks_passed(r.stdout, 4)


def test_bench_check_mode_reports_no_wrong_elements(job):
    r = job.run(4, "smddp-bench", "-o", "allreduce", "-b", "8", "-e", "64M", "-f", "4", "-c", "1", "-n", "3", "-w", "1")
    assert r.returncode == 0, r.stdout[-4000:]
    rows = [l.split() for l in r.stdout.splitlines() if re.match(r"^\s*\d+\s+\d+\s+float", l)]
    assert len(rows) >= 10, r.stdout[-4000:]
    assert all(row[-1] == "0" for row in rows), r.stdout[-4000:]
    assert "Out of bounds values : 0" in r.stdout


def test_rank_command_that_cannot_run_fails_the_job(job):
    r = job.run(2, "does-not-exist")
    assert r.returncode != 0
    assert "cannot run" in r.stdout
