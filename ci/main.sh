#!/usr/bin/env bash
# The main job: set up, build, then run the seed scenario (TorchRec #1739) and the regression
# suite.  Reports land in reports/<scenario>/<run>.json.  Exit status is dmpcheck's:
# 0 every expectation held, 1 one did not, 2 bad input, 3 a rank failed or timed out.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
bash ci/build.sh
build_dir=${DMPCHECK_BUILD_DIR:-build}
exec "$build_dir/harness/dmpcheck" run scenarios/regressions/*.yaml --out reports "$@"
