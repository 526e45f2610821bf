#!/usr/bin/env bash
# Installs the Debian packages smddp needs (idempotent, apt-get only), then configures and
# builds into build/. Safe to run again: it installs only what is missing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

PKGS=(
  build-essential cmake ninja-build pkg-config git procps psmisc iproute2
  libboost-dev libboost-program-options-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev
  openmpi-bin libopenmpi-dev
  libfabric-dev libfabric-bin
  python3 python3-pytest python3-numpy python3-torch libtorch-dev pybind11-dev python3-dev
  python3-mpi4py
  clang libclang-rt-14-dev
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "${SMDDP_SKIP_BUILD:-0}" = "1" ]; then exit 0; fi
BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" ${SMDDP_CMAKE_ARGS:-}
cmake --build build -j"$(nproc)"
