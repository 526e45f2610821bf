"""scripts/device-check.sh's summary: a step whose tests skipped is marked so, with the count.
The script is sourced for its functions (it runs nothing then) and fed logs of the forms the
steps write: pytest's summary line, gtest's, and neither."""

import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "device-check.sh")

LOGS = {
    "all_pass": "....\n4 passed in 10.21s\n",
    "some_skipped": "SKIPPED [1] test_gpu_multinode.py:40: needs 2 GPUs\n1 passed, 1 skipped in 30.02s\n",
    "all_skipped": "ss\nevery test skipped (needs 2 GPUs): exit 77\n2 skipped in 1.10s\n",
    "failed_and_skipped": "= 1 failed, 3 passed, 2 skipped, 1 deselected in 9.0s =\n",
    "gtest_skipped": "[  PASSED  ] 0 tests.\n[  SKIPPED ] 5 tests, listed below:\n[  SKIPPED ] A.b\n",
    "bench": "size 8 B: 12.0 us\n1 passed the warm-up\n",
}


def run(tmp_path, body):
    for name, text in LOGS.items():
        (tmp_path / (name + ".log")).write_text(text)
    out = subprocess.run(["bash", "-c", 'source "$1"; cd "$2"; ' + body, "bash", SCRIPT, str(tmp_path)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
    assert out.returncode == 0, out.stdout
    return out.stdout


def test_skip_counts_from_logs(tmp_path):
    got = run(tmp_path, 'for n in all_pass some_skipped all_skipped failed_and_skipped gtest_skipped bench missing; '
                        'do echo "$n $(skipped_in $n.log)"; done')
    counts = dict(line.split() for line in got.split("\n") if line)
    assert counts == {"all_pass": "0", "some_skipped": "1", "all_skipped": "2", "failed_and_skipped": "2",
                      "gtest_skipped": "5", "bench": "0", "missing": "0"}


def test_summary_marks_skipped_steps(tmp_path):
    got = run(tmp_path, 'declare -A step_rc step_skipped; '
                        'step_rc[gpu_multinode]=0; step_skipped[gpu_multinode]=$(skipped_in some_skipped.log); '
                        'step_rc[gpu_capture]=77; step_skipped[gpu_capture]=$(skipped_in all_skipped.log); '
                        'step_rc[gpu_training]=0; step_skipped[gpu_training]=$(skipped_in all_pass.log); '
                        'step_rc[bench_sweep]=0; step_skipped[bench_sweep]=$(skipped_in bench.log); write_summary')
    summary = json.loads(got)
    assert summary == {"gpu_multinode": 0, "gpu_capture": 77, "gpu_training": 0, "bench_sweep": 0,
                       "skipped": {"gpu_multinode": 1, "gpu_capture": 2}}


def test_summary_without_steps_is_json(tmp_path):
    assert json.loads(run(tmp_path, "declare -A step_rc step_skipped; write_summary")) == {"skipped": {}}
