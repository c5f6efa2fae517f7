#!/usr/bin/env bash
# The main job: set up, build, install the real TorchRec releases either side of the seed bug
# (0.6.0 and 1.9.2, ci/torchrec-env.sh), run the seed scenario (TorchRec #1739) on the reference
# under both profiles and on both real releases, then the whole regression library as a suite
# (progress, and JSON/JUnit/Markdown/HTML reports under reports/<timestamp>/).  Exit status is
# the worst of dmpcheck's: 0 every expectation held, 1 one did not, 2 bad input, 3 a rank failed or
# timed out, or a release environment failed to install (named last).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
bash ci/torchrec-env.sh 0.6.0 1.9.2 > "${TMPDIR:-/tmp}/dmpcheck-torchrec-env.log" 2>&1 &
env_pid=$!
bash ci/build.sh dmpcheck   # the CLI alone: the tests are built by ci/test.sh
env_status=0
wait "$env_pid" || env_status=$?
dmpcheck=${DMPCHECK_BUILD_DIR:-build}/harness/dmpcheck
status=0
worst() { [ "$1" -gt "$status" ] && status=$1; return 0; }   # the worst status of all, not the last
rc=0; "$dmpcheck" run scenarios/regressions/torchrec-1739-dp-tables-not-broadcast.yaml --out reports "$@" || rc=$?; worst "$rc"
rc=0; "$dmpcheck" suite scenarios/regressions --out reports || rc=$?; worst "$rc"
if [ "$env_status" -ne 0 ]; then
  # Last, where it is seen: which release environments did not install (their cells were skipped).
  grep -E 'pip failed|does not import|is not in' "${TMPDIR:-/tmp}/dmpcheck-torchrec-env.log" || true
  echo "ci/main.sh: the TorchRec environments failed to install (log: ${TMPDIR:-/tmp}/dmpcheck-torchrec-env.log); their cells were skipped"
  worst 3
fi
exit $status
