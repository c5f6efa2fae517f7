#!/usr/bin/env bash
# dmpcheck against the torch its users have: the libtorch inside torch 2.14.1's PyPI wheel (the
# wheel of the torchrec 1.9.2 environment, ci/torchrec-env.sh), besides Debian's 1.13.
#  1. build/ -> build-torch2/: the whole project against that libtorch, and every CTest test;
#  2. `pip install --no-build-isolation .` into a fresh venv that has that torch, then
#     `import torch, dmpcheck` in one process and `pytest scenarios/` from a folder without this
#     repository's conftest (the plugin comes from its entry point).
# The venvs see the torch of the 1.9.2 environment through a .pth file instead of a second 5 GB
# install; pytest and scikit-build-core come from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${XDG_CACHE_HOME:-$HOME/.cache}/dmpcheck
envs=${DMPCHECK_TORCHREC_ENVS:-$cache/torchrec}
torch_env=$envs/torchrec-1.9.2
bash ci/torchrec-env.sh 1.9.2 > "${TMPDIR:-/tmp}/dmpcheck-torch2-env.log" 2>&1 ||
  { cat "${TMPDIR:-/tmp}/dmpcheck-torch2-env.log"; echo "ci/torch2.sh: the torch 2.14.1 environment did not install"; exit 1; }
site=$("$torch_env/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")

# A venv from Debian's Python (the one torch's environment was made from) that sees that torch.
make_venv() {
  /usr/bin/python3 -m venv "$1"
  echo "$site" > "$("$1/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/dmpcheck-torch.pth"
  "$1/bin/pip" install -q --disable-pip-version-check pytest==9.2.0 scikit-build-core==1.1.2
}

dev=$cache/torch2-dev
if [[ ! -f $dev/.ready ]]; then
  rm -rf "$dev"
  make_venv "$dev"
  touch "$dev/.ready"
fi
"$dev/bin/python" -c "import torch; print('ci/torch2.sh: torch', torch.__version__, 'at', torch.__file__)"

echo "== 1. the whole project and its tests against torch 2.14.1's libtorch (build-torch2/)"
start=$(date +%s)
cmake -S . -B build-torch2 -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDMPCHECK_BUILD_TESTS=ON \
  -DDMPCHECK_WITH_BENCHMARKS=OFF -DDMPCHECK_TORCH_PYTHON="$dev/bin/python" > /dev/null
cmake --build build-torch2 -- -j"$(nproc)"
echo "ci/torch2.sh: built in $(( $(date +%s) - start )) s"
start=$(date +%s)
# Every test but the release cells' (label torchrec): those run the releases' own interpreters and
# only read back files, they ran in ci/test.sh, and this build meets the releases again below (the
# regression library from the pip install) and in .ci/run's fidelity table; skipping them here
# keeps CI within its time.
DMPCHECK_REQUIRE_TORCHREC=1 DMPCHECK_REQUIRE_MULTIHOST=$([ "$(id -u)" -eq 0 ] && echo 1 || echo 0) \
  ctest --test-dir build-torch2 --output-on-failure -j"$(nproc)" -LE torchrec "$@"
echo "ci/torch2.sh: tests against torch 2.14.1 ran in $(( $(date +%s) - start )) s"

echo "== 2. pip install . into a fresh venv with torch 2.14.1; the module beside torch; pytest by entry point"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
make_venv "$scratch/venv"
# Plain `pip install .` (pip's default build isolation hides the venv's torch): it must stop and say
# what to type, not fail on a bare "No module named 'torch'".
if "$scratch/venv/bin/pip" install -q --disable-pip-version-check --config-settings=build-dir="$scratch/isolated" . \
    > "$scratch/isolated.log" 2>&1; then
  echo "ci/torch2.sh: plain pip install . built, which needs the venv's torch: isolation is no longer what it was"; exit 1
fi
grep -q 'pip install --no-build-isolation' "$scratch/isolated.log" ||
  { cat "$scratch/isolated.log"; echo "ci/torch2.sh: plain pip install . failed without saying what to type"; exit 1; }
echo "ci/torch2.sh: plain pip install . stops and says: pip install --no-build-isolation ."
start=$(date +%s)
# --config-settings build-dir: pip's build reuses the objects of step 1 (same torch, same flags), to keep CI within
# its time; a build from nothing (what a newcomer's `pip install .` does) took 3 min 51 s here.
"$scratch/venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --config-settings=build-dir=build-torch2 .
echo "ci/torch2.sh: pip install built and installed in $(( $(date +%s) - start )) s"
cp -r scenarios "$scratch/scenarios"
# A script cell's file names its script where it lies: the reporter's own, under benchmarks/.
mkdir -p "$scratch/benchmarks" && cp -r benchmarks/reporter-1739 "$scratch/benchmarks/"
(cd "$scratch" &&
  "$scratch/venv/bin/python" -c "import torch, dmpcheck; s = dmpcheck.load_scenario('scenarios/regressions/torchrec-1739-dp-tables-not-broadcast.yaml'); print('import torch, dmpcheck: torch', torch.__version__, '- dmpcheck from', dmpcheck.__file__, '-', s['name'])" &&
  "$scratch/venv/bin/dmpcheck" validate scenarios/regressions > /dev/null &&
  [[ ! -e conftest.py ]] &&
  "$scratch/venv/bin/python" -m pytest -q -p no:cacheprovider scenarios/regressions)
echo "ci/torch2.sh: pip install, import beside torch and pytest scenarios/ (no conftest): passed"
