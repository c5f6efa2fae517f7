#!/usr/bin/env bash
# Configures and builds dmpcheck into build/ (Ninja, ccache, precompiled ATen header).
# With target names (e.g. `bash ci/build.sh dmpcheck`) only those are built: the main job builds
# the CLI alone, the test job everything, and then lints (ci/lint.py: clang-format, clang-tidy).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${DMPCHECK_BUILD_DIR:-build}
start=$(date +%s)
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDMPCHECK_BUILD_TESTS=ON >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$build_dir" "${targets[@]}" -- -j"$(nproc)"
echo "ci/build.sh: built ${*:-everything} in $(( $(date +%s) - start )) s"
# A full build is also checked: clang-format and clang-tidy (ci/lint.py); a finding fails it.
if [ $# -eq 0 ]; then
  /usr/bin/python3 ci/lint.py --build-dir "$build_dir"
fi
