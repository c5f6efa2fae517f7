#!/usr/bin/env bash
# The main job: set up, build, install the real TorchRec releases either side of the seed bug
# (0.6.0 and 1.9.2, ci/torchrec-env.sh), run the seed scenario (TorchRec #1739) on the reference
# under both profiles and on both real releases, then the whole regression library as a suite
# (progress, and JSON/JUnit/Markdown/HTML reports under reports/<timestamp>/).  Exit status is
# dmpcheck's: 0 every expectation held, 1 one did not, 2 bad input, 3 a rank failed or timed out.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
bash ci/torchrec-env.sh 0.6.0 1.9.2 > "${TMPDIR:-/tmp}/dmpcheck-torchrec-env.log" 2>&1 &
env_pid=$!
bash ci/build.sh dmpcheck   # the CLI alone: the tests are built by ci/test.sh
wait "$env_pid" || { cat "${TMPDIR:-/tmp}/dmpcheck-torchrec-env.log"; echo "ci/main.sh: the TorchRec environments failed to install; their cells will be skipped"; }
dmpcheck=${DMPCHECK_BUILD_DIR:-build}/harness/dmpcheck
status=0
"$dmpcheck" run scenarios/regressions/torchrec-1739-dp-tables-not-broadcast.yaml --out reports "$@" || status=$?
"$dmpcheck" suite scenarios/regressions --out reports || status=$?
exit $status
