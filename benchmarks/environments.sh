#!/usr/bin/env bash
# Side by side, in one run: how long ci/torchrec-env.sh takes, and how much disk it leaves, to make
# a fresh release environment with plain pip and with uv, then a second release that shares torch
# and fbgemm with the first (issue 45).  Every case starts from an empty cache of its own (a new
# machine: downloads included), in a scratch root on the disk of $DMPCHECK_TORCHREC_ENVS (hard
# links need one file system); uv itself is found or installed before any clock starts.
#
#   bash benchmarks/environments.sh                 # 1.5.0, then 1.5.1 (both torch 2.10.0, fbgemm 1.5.0)
#   bash benchmarks/environments.sh 1.9.1 1.9.2     # any two releases of torchrec_sut/pins.tsv
#
# Prints one line per case and the ratios of uv to pip.  Needs PyPI and, at its peak, about 16 GB
# free (pip's environment, its download cache and its unpacking): each case's files are removed as
# soon as measured.
# Absolute seconds follow the line to PyPI; the ratios, measured on one line minutes apart, are the
# result.  Disk is what `du` counts, a file hard-linked twice counted once.
set -euo pipefail
cd "$(dirname "$0")/.."
first=${1:-1.5.0}
second=${2:-1.5.1}
envs=${DMPCHECK_TORCHREC_ENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/dmpcheck/torchrec}
mkdir -p "$envs"
scratch=$(mktemp -d "$envs/bench-XXXXXX")
trap 'rm -rf "$scratch"' EXIT
free_gb=$(( $(df --output=avail -k "$envs" | tail -n 1) / 1024 / 1024 ))
if (( free_gb < 16 )); then
  echo "benchmarks/environments.sh: $envs has ${free_gb} GB free; a fresh pip environment with its download cache and the build's scratch need about 16" >&2
  exit 2
fi
echo "benchmarks/environments.sh: torchrec $first then $second, scratch $scratch ($(df -h --output=avail "$envs" | tail -n 1 | tr -d ' ') free)"

# uv before any clock: from PATH, from the environments' own copy, or installed into the scratch.
if ! command -v uv >/dev/null; then
  if [ -x "$envs/uv/bin/uv" ]; then
    PATH=$envs/uv/bin:$PATH
  else
    /usr/bin/python3 -m venv "$scratch/uv" && "$scratch/uv/bin/python" -m pip install -q uv
    PATH=$scratch/uv/bin:$PATH
  fi
fi
export PATH
echo "benchmarks/environments.sh: $(uv --version) at $(command -v uv); $(/usr/bin/python3 -m pip --version | cut -d' ' -f1-2)"

declare -A seconds megabytes
# MB of the paths that exist (pip keeps no cache where its index forbids storing: then none).
mb() {
  local have=() p
  for p in "$@"; do [ -e "$p" ] && have+=("$p"); done
  if [ ${#have[@]} -eq 0 ]; then echo 0; else du -smc "${have[@]}" | tail -n 1 | cut -f1; fi
}
# make CASE TOOL ROOT RELEASE: one install, timed, its output kept in the scratch.
make() {
  local case=$1 tool=$2 root=$3 release=$4 start end
  start=$(date +%s.%N)
  if ! DMPCHECK_TORCHREC_ENVS=$root DMPCHECK_TORCHREC_INSTALLER_TOOL=$tool UV_CACHE_DIR=$root/uv-cache \
    PIP_CACHE_DIR=$root/pip-cache DMPCHECK_TORCHREC_BUDGET_GB=1000 \
    bash ci/torchrec-env.sh "$release" >"$scratch/$case.log" 2>&1; then
    echo "benchmarks/environments.sh: $case failed; its output:" >&2
    cat "$scratch/$case.log" >&2
    exit 1
  fi
  end=$(date +%s.%N)
  seconds[$case]=$(echo "$end - $start" | bc)
}

# pip: each environment a full copy; its own download cache kept between its two.
pip_root=$scratch/pip
make pip-first pip "$pip_root" "$first"
megabytes[pip-first]=$(mb "$pip_root/torchrec-$first" "$pip_root/pip-cache")
cache_after_first=$(mb "$pip_root/pip-cache")
rm -rf "${pip_root:?}/torchrec-$first"  # (room for the second; pip shares nothing with it anyway)
make pip-second pip "$pip_root" "$second"
megabytes[pip-second]=$(($(mb "$pip_root/torchrec-$second" "$pip_root/pip-cache") - cache_after_first))
rm -rf "$pip_root"

# uv: the second environment links the first's torch and fbgemm from the cache.
uv_root=$scratch/uv-envs
make uv-first uv "$uv_root" "$first"
megabytes[uv-first]=$(mb "$uv_root/torchrec-$first" "$uv_root/uv-cache")
make uv-second uv "$uv_root" "$second"
megabytes[uv-second]=$(($(mb "$uv_root/torchrec-$first" "$uv_root/uv-cache" "$uv_root/torchrec-$second") - megabytes[uv-first]))

ratio() { printf "%.2f" "$(echo "scale=4; $1 / $2" | bc)"; }
# Disk: what the case added, its installer's cache included (the first of each) and a file linked
# twice counted once.
printf '\n%-40s %10s %18s\n' "case" "seconds" "new on disk (MB)"
printf '%-40s %10.1f %18s\n' "pip, fresh: torchrec $first" "${seconds[pip-first]}" "${megabytes[pip-first]}"
printf '%-40s %10.1f %18s\n' "pip, second: torchrec $second" "${seconds[pip-second]}" "${megabytes[pip-second]}"
printf '%-40s %10.1f %18s\n' "uv, fresh: torchrec $first" "${seconds[uv-first]}" "${megabytes[uv-first]}"
printf '%-40s %10.1f %18s\n' "uv, second: torchrec $second" "${seconds[uv-second]}" "${megabytes[uv-second]}"
echo
echo "uv / pip, fresh environment:  time $(ratio "${seconds[uv-first]}" "${seconds[pip-first]}"), disk $(ratio "${megabytes[uv-first]}" "${megabytes[pip-first]}")"
echo "uv / pip, second environment: time $(ratio "${seconds[uv-second]}" "${seconds[pip-second]}"), disk $(ratio "${megabytes[uv-second]}" "${megabytes[pip-second]}")"
