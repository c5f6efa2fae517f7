#!/usr/bin/env bash
# Set up, build, and run every test (unit and multi-process) through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
bash ci/build.sh
build_dir=${DMPCHECK_BUILD_DIR:-build}
start=$(date +%s)
ctest --test-dir "$build_dir" --output-on-failure -j"$(nproc)" "$@"
echo "ci/test.sh: tests ran in $(( $(date +%s) - start )) s"
