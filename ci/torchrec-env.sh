#!/usr/bin/env bash
# Creates one Python environment per TorchRec release, from PyPI, as pinned in torchrec_sut/pins.tsv.
#
#   bash ci/torchrec-env.sh 0.6.0 1.9.2     # those releases
#   bash ci/torchrec-env.sh all             # every release in the pin table
#   bash ci/torchrec-env.sh --list          # the pin table and which environments are ready
#
# Environments live outside the source tree, in $DMPCHECK_TORCHREC_ENVS (default
# ~/.cache/dmpcheck/torchrec), one folder per release: torchrec-<version>/.  Files a new one has in
# common with the ready ones (the same torch, numpy ...) become hard links to theirs
# (ci/share-env-files.py; DMPCHECK_TORCHREC_SHARE=0 turns it off).  A folder is ready when
# it holds dmpcheck-ready.json (written last, after `import torch, fbgemm_gpu, torchrec` succeeded,
# with the versions that import reported, as the rank program's probe answer); a folder
# without it is a broken install and is rebuilt.
# Running it again for a ready release does nothing.  About 5 GB and 1.5-2 minutes per release.
#
# The environments stay within a disk budget, $DMPCHECK_TORCHREC_BUDGET_GB (default 40): before a
# release is created, the least recently used ready ones (dmpcheck touches dmpcheck-last-used in
# an environment each time a cell runs on it) are removed until the new one fits, but never one a
# running dmpcheck cell is using (it holds dmpcheck-in-use.lock).  Two of these running at once for the same release take turns
# (flock), so the second finds it ready instead of building it over the first.  dmpcheck runs this
# itself where a release it needs is missing (`dmpcheck bisect`, or `run`/`suite` with --install).
set -euo pipefail
cd "$(dirname "$0")/.."
pins=${DMPCHECK_TORCHREC_PINS:-torchrec_sut/pins.tsv}
root=${DMPCHECK_TORCHREC_ENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/dmpcheck/torchrec}
python=${DMPCHECK_TORCHREC_PYTHON:-/usr/bin/python3}
budget_mb=$(( ${DMPCHECK_TORCHREC_BUDGET_GB:-40} * 1024 ))
env_mb=6144  # what one environment takes, rounded up (measured: 5.0-5.6 GB)
# (The test of the eviction sets both in MB: DMPCHECK_TORCHREC_BUDGET_MB, DMPCHECK_TORCHREC_ENV_MB.)
budget_mb=${DMPCHECK_TORCHREC_BUDGET_MB:-$budget_mb}
env_mb=${DMPCHECK_TORCHREC_ENV_MB:-$env_mb}

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }

# Removes least recently used ready environments (not $1, none used in the last 10 minutes) until
# the ones left and a new one fit in the budget.
make_room() {
  local keep=$1 total d removed
  while :; do
    # One du over them all: a file the environments share as hard links counts once.
    total=0
    if compgen -G "$root/torchrec-*/" >/dev/null; then
      total=$(du -smc "$root"/torchrec-*/ | tail -n 1 | cut -f1)
    fi
    (( total + env_mb <= budget_mb )) && return 0
    # Ready environments, least recently used first (dmpcheck-last-used, else when it was made).
    removed=""
    while read -r d; do
      [ -n "$d" ] || continue
      # A dmpcheck cell running on it holds dmpcheck-in-use.lock shared: then it stays.  Held
      # exclusively here while it is removed, so no cell starts on it half-removed.
      if flock -n -x "$d/dmpcheck-in-use.lock" rm -rf "$d" 2>/dev/null; then
        echo "ci/torchrec-env.sh: removed the least recently used environment $d to stay within ${budget_mb} MB (DMPCHECK_TORCHREC_BUDGET_GB)"
        removed=$d; break
      fi
    done < <(for d in "$root"/torchrec-*/; do
               d=${d%/}
               [ -f "$d/dmpcheck-ready.json" ] && [ "$d" != "$root/torchrec-$keep" ] || continue
               used=$d/dmpcheck-last-used; [ -f "$used" ] || used=$d/dmpcheck-ready.json
               printf '%s\t%s\n' "$(stat -c %Y "$used")" "$d"
             done | sort -n | cut -f2)
    if [ -z "$removed" ]; then
      echo "ci/torchrec-env.sh: the environments take ${total} MB of the ${budget_mb} MB budget and none can go (every other one is in use by a running dmpcheck); creating torchrec $keep over budget" >&2
      return 0
    fi
  done
}
releases() { grep -v '^#' "$pins" | awk -F'\t' 'NF>=3 {print $1}'; }

if [ $# -eq 0 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then usage; exit 0; fi
if [ "$1" = "--list" ]; then
  printf '%-8s %-8s %-14s %s\n' torchrec torch fbgemm-gpu-cpu environment
  grep -v '^#' "$pins" | while IFS=$'\t' read -r trec torch fbgemm _; do
    state="missing (bash ci/torchrec-env.sh $trec)"
    [ -f "$root/torchrec-$trec/dmpcheck-ready.json" ] && state="ready: $root/torchrec-$trec"
    printf '%-8s %-8s %-14s %s\n' "$trec" "$torch" "$fbgemm" "$state"
  done
  exit 0
fi
wanted=("$@")
[ "$1" = "all" ] && mapfile -t wanted < <(releases)

# venv needs Debian's python3-venv for the interpreter we build on.
if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
  sudo_cmd=(); [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  echo "ci/torchrec-env.sh: installing python3-venv"
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends python3-venv >/dev/null \
    || { DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends python3-venv >/dev/null; }
fi

mkdir -p "$root"
status=0
for rel in "${wanted[@]}"; do
  line=$(grep -v '^#' "$pins" | awk -F'\t' -v r="$rel" '$1==r' || true)
  if [ -z "$line" ]; then
    echo "ci/torchrec-env.sh: torchrec $rel is not in $pins; pinned releases: $(releases | tr '\n' ' ')" >&2
    status=2; continue
  fi
  IFS=$'\t' read -r trec torch fbgemm others <<<"$line"
  env_dir="$root/torchrec-$trec"
  if [ -f "$env_dir/dmpcheck-ready.json" ]; then
    echo "ci/torchrec-env.sh: torchrec $trec ready in $env_dir"; continue
  fi
  # One creator per release at a time; whoever waited finds it ready.
  exec {lock}>"$root/.torchrec-$trec.lock"
  flock "$lock"
  if [ -f "$env_dir/dmpcheck-ready.json" ]; then
    echo "ci/torchrec-env.sh: torchrec $trec ready in $env_dir (made meanwhile by another process)"
    exec {lock}>&-; continue
  fi
  make_room "$trec"
  start=$(date +%s)
  echo "ci/torchrec-env.sh: creating $env_dir (torch $torch, fbgemm-gpu-cpu $fbgemm, $others)"
  rm -rf "$env_dir"
  "$python" -m venv "$env_dir"
  pip=("$env_dir/bin/python" -m pip --disable-pip-version-check -q)
  read -r -a extra <<<"$others"
  [ "$others" = "-" ] && extra=()
  if ! "${pip[@]}" install "torch==$torch" "fbgemm-gpu-cpu==$fbgemm" "${extra[@]}" ||
     ! "${pip[@]}" install --no-deps "torchrec==$trec"; then
    echo "ci/torchrec-env.sh: pip failed for torchrec $trec; $env_dir left without dmpcheck-ready.json (run again to retry)" >&2
    status=1; exec {lock}>&-; continue
  fi
  # The marker is the rank program's probe answer (a contract document: the versions the imports
  # report), written only when torch, fbgemm_gpu and torchrec import together.
  if ! OMP_NUM_THREADS=1 PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="${DMPCHECK_TORCHREC_SUT:-$PWD/torchrec_sut}" \
       "$env_dir/bin/python" -m dmpcheck_torchrec.probe "$env_dir/dmpcheck-ready.json.tmp"
  then
    echo "ci/torchrec-env.sh: torchrec $trec installed but does not import (see above); not marked ready" >&2
    status=1; exec {lock}>&-; continue
  fi
  # Before it is ready, so that no cell runs on it while its files are replaced by links.
  if [ "${DMPCHECK_TORCHREC_SHARE:-1}" = 1 ]; then
    "$python" ci/share-env-files.py "$root" "torchrec-$trec" || echo "ci/torchrec-env.sh: sharing files failed (the environment works without it)" >&2
  fi
  echo "  imported: $(cat "$env_dir/dmpcheck-ready.json.tmp")"
  mv "$env_dir/dmpcheck-ready.json.tmp" "$env_dir/dmpcheck-ready.json"
  exec {lock}>&-
  echo "ci/torchrec-env.sh: torchrec $trec ready in $env_dir ($(( $(date +%s) - start )) s)"
done
exit $status
