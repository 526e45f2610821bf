"""The GPU suites reuse the plugin tests' fixtures and rank scripts (tests/python)."""

import importlib.util
import os

_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "conftest.py")
_spec = importlib.util.spec_from_file_location("smddp_plugin_conftest", _path)
_shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)
globals().update({k: v for k, v in vars(_shared).items() if not k.startswith("__")})


def gpu_ranks():
    """Ranks of a GPU job: SMDDP_TEST_NPROC (device-check.sh --all-gpus sets the machine's GPU
    count, up to 8), else 2."""
    import os
    return max(2, min(8, int(os.environ.get("SMDDP_TEST_NPROC", "2") or 2)))


def gpu_count():
    """CUDA GPUs the test Python sees (0 where torch or CUDA is missing)."""
    import subprocess
    try:
        out = subprocess.run([python_exe(), "-c", "import torch; print(torch.cuda.device_count())"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=120)
        return int(out.stdout.strip() or 0)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 0
