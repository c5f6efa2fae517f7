#!/usr/bin/env bash
# Set up, build, and run every test through CTest: unit, multi-process, Python, install, and the
# real TorchRec releases under test (their environments, 0.6.0 and 1.9.2, are installed first, and
# 0.7.0, which the commit bisection's test runs TorchRec's commits over; a missing one fails the
# torchrec tests here instead of skipping them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
# The release environments download while the build compiles (network vs. CPU).
bash ci/torchrec-env.sh 0.6.0 1.9.2 0.7.0 'torchrec==1.2.0 fbgemm-gpu-cpu==1.1.0' 1.2.0 > "${TMPDIR:-/tmp}/dmpcheck-torchrec-env.log" 2>&1 &
env_pid=$!
build_status=0
bash ci/build.sh || build_status=$?
env_status=0
wait "$env_pid" || env_status=$?
grep -v DEPRECATION "${TMPDIR:-/tmp}/dmpcheck-torchrec-env.log" | grep -E "ready|failed|not" || true
[ "$build_status" -eq 0 ] || exit "$build_status"
[ "$env_status" -eq 0 ] || { echo "ci/test.sh: installing the TorchRec environments failed (log above)"; exit "$env_status"; }
build_dir=${DMPCHECK_BUILD_DIR:-build}
start=$(date +%s)
DMPCHECK_REQUIRE_TORCHREC=1 DMPCHECK_REQUIRE_MULTIHOST=$([ "$(id -u)" -eq 0 ] && echo 1 || echo 0) ctest --test-dir "$build_dir" --output-on-failure -j"$(nproc)" "$@"
echo "ci/test.sh: tests ran in $(( $(date +%s) - start )) s"
# The same tests against torch 2.14.1's libtorch, and `pip install .` in a fresh venv.
bash ci/torch2.sh
# The GPU checks' script (ci/device.sh, docs/performance.md) as a dry run: its own build from the
# carried dependencies only (this machine's copies hidden, as root), every step, NCCL's skipped
# with the reason.
bash ci/device-deps.sh
bash ci/device.sh --dry-run --python "${XDG_CACHE_HOME:-$HOME/.cache}/dmpcheck/torch2-dev/bin/python" \
  $([ "$(id -u)" -eq 0 ] && echo --mask-system-deps)
