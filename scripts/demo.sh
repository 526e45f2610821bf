#!/usr/bin/env bash
# The main job: installs what is missing, builds, then trains a small model with PyTorch DDP
# on the smddp backend, 2 ranks on this machine through smddprun, printing the loss per step
# and, at the end, the daemon's status and health as an operator sees them.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
./scripts/setup.sh
export PATH="$here/build/bin:$PATH"
# Debian's PyTorch lives under /usr/bin/python3 (a pyenv python3 may come first on PATH).
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
exec smddprun --nproc-per-node "${NPROC:-2}" --config configs/local.ini -- \
  "$PY" examples/train_ddp.py --steps "${STEPS:-20}" --show-status "$@"
