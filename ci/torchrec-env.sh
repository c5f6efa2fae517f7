#!/usr/bin/env bash
# Creates one Python environment per TorchRec release, from PyPI, as pinned in torchrec_sut/pins.tsv.
#
#   bash ci/torchrec-env.sh 0.6.0 1.9.2     # those releases
#   bash ci/torchrec-env.sh all             # every release in the pin table
#   bash ci/torchrec-env.sh --list          # the pin table and which environments are ready
#
# Environments live outside the source tree, in $DMPCHECK_TORCHREC_ENVS (default
# ~/.cache/dmpcheck/torchrec), one folder per release: torchrec-<version>/.  A folder is ready when
# it holds dmpcheck-ready.json (written last, after `import torch, fbgemm_gpu, torchrec` succeeded,
# with the versions that import reported); a folder without it is a broken install and is rebuilt.
# Running it again for a ready release does nothing.  About 5 GB and 1.5-2 minutes per release.
set -euo pipefail
cd "$(dirname "$0")/.."
pins=torchrec_sut/pins.tsv
root=${DMPCHECK_TORCHREC_ENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/dmpcheck/torchrec}
python=${DMPCHECK_TORCHREC_PYTHON:-/usr/bin/python3}

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
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
    status=1; continue
  fi
  if ! OMP_NUM_THREADS=1 "$env_dir/bin/python" - "$env_dir/dmpcheck-ready.json.tmp" <<'PY'
import json, sys, platform
import torch, fbgemm_gpu, torchrec  # the whole point: these three must import together
from importlib.metadata import version
info = {"torchrec": version("torchrec"), "torch": torch.__version__,
        "fbgemm_gpu": version("fbgemm-gpu-cpu"), "python": platform.python_version()}
json.dump(info, open(sys.argv[1], "w"))
print("  imported:", info)
PY
  then
    echo "ci/torchrec-env.sh: torchrec $trec installed but does not import (see above); not marked ready" >&2
    status=1; continue
  fi
  mv "$env_dir/dmpcheck-ready.json.tmp" "$env_dir/dmpcheck-ready.json"
  echo "ci/torchrec-env.sh: torchrec $trec ready in $env_dir ($(( $(date +%s) - start )) s)"
done
exit $status
