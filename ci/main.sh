#!/usr/bin/env bash
# The main job: set up, build, run the seed scenario (TorchRec #1739) with its full tables, then
# the whole regression library as a suite (progress, and JSON/JUnit/Markdown/HTML reports under
# reports/<timestamp>/).  Exit status is dmpcheck's: 0 every expectation held, 1 one did not,
# 2 bad input, 3 a rank failed or timed out.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
bash ci/build.sh
dmpcheck=${DMPCHECK_BUILD_DIR:-build}/harness/dmpcheck
status=0
"$dmpcheck" run scenarios/regressions/torchrec-1739-dp-tables-not-broadcast.yaml --out reports "$@" || status=$?
"$dmpcheck" suite scenarios/regressions --out reports || status=$?
exit $status
