#!/usr/bin/env bash
# Configures and builds dmpcheck into build/ (Ninja, ccache, precompiled ATen header).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${DMPCHECK_BUILD_DIR:-build}
start=$(date +%s)
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDMPCHECK_BUILD_TESTS=ON >/dev/null
cmake --build "$build_dir" -- -j"$(nproc)"
echo "ci/build.sh: built in $(( $(date +%s) - start )) s"
