#!/usr/bin/env bash
# Creates one Python environment per TorchRec system, from PyPI: a release as pinned in
# torchrec_sut/pins.tsv, or a release with some packages pinned otherwise (a set of pins).
#
#   bash ci/torchrec-env.sh 0.6.0 1.9.2              # those releases
#   bash ci/torchrec-env.sh 'torchrec==1.2.0 fbgemm-gpu-cpu==1.1.0'    # a set of pins, one argument
#   bash ci/torchrec-env.sh all                      # every release in the pin table
#   bash ci/torchrec-env.sh --list                   # the pin table and which environments are ready
#
# A set of pins names torchrec==X.Y.Z (a pinned release) and NAME==VERSION for any package, or
# python==3.N for the interpreter; what it does not name comes from the release's row, except
# torch, which follows a pinned fbgemm-gpu-cpu (an fbgemm build works with one torch only: the
# table's row that pins that fbgemm names it) unless torch is pinned too.
# Environments live outside the source tree, in $DMPCHECK_TORCHREC_ENVS (default
# ~/.cache/dmpcheck/torchrec), one folder each: torchrec-<version>/, or
# torchrec-<version>+<name>=<version>... for a set.  uv makes them (`uv venv`, `uv pip install`),
# linking every file from its cache ($DMPCHECK_TORCHREC_ENVS/uv-cache) so that environments
# sharing torch share its bytes: 15-25 s for one whose wheels are cached or downloaded on a fast
# line.  uv is taken from PATH, else installed once with pip into $DMPCHECK_TORCHREC_ENVS/uv/; where
# it cannot be had (or DMPCHECK_TORCHREC_INSTALLER_TOOL=pip), plain venv + pip do it, said once.
# A folder is ready when it holds dmpcheck-ready.json (written last, after `import torch,
# fbgemm_gpu, torchrec` succeeded, with the versions that import reported, as the rank program's
# probe answer); a folder without it is a broken install and is rebuilt.  Running it again for
# a ready one does nothing.
#
# The environments and uv's cache stay within a disk budget, $DMPCHECK_TORCHREC_BUDGET_GB
# (default 40): before one is created, the least recently used ready ones (dmpcheck touches
# dmpcheck-last-used in an environment each time a cell runs on it) are removed until the new one
# fits, then uv's cache is cleared if it must (environments keep their files: they are hard links);
# never one a running dmpcheck cell is using (it holds dmpcheck-in-use.lock).  Two of these running
# at once for the same environment take turns (flock), so the second finds it ready.  dmpcheck runs
# this itself where a system it needs is missing (`dmpcheck bisect`, or `run`/`suite` with --install).
set -euo pipefail
cd "$(dirname "$0")/.."
pins=${DMPCHECK_TORCHREC_PINS:-torchrec_sut/pins.tsv}
root=${DMPCHECK_TORCHREC_ENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/dmpcheck/torchrec}
default_python=${DMPCHECK_TORCHREC_PYTHON:-/usr/bin/python3}
budget_mb=$(( ${DMPCHECK_TORCHREC_BUDGET_GB:-40} * 1024 ))
env_mb=6144  # what one environment takes, rounded up (measured: 5.0-5.6 GB)
# (The test of the eviction sets both in MB: DMPCHECK_TORCHREC_BUDGET_MB, DMPCHECK_TORCHREC_ENV_MB.)
budget_mb=${DMPCHECK_TORCHREC_BUDGET_MB:-$budget_mb}
env_mb=${DMPCHECK_TORCHREC_ENV_MB:-$env_mb}
export UV_CACHE_DIR=${UV_CACHE_DIR:-$root/uv-cache} UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1

usage() { sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; }
say() { echo "ci/torchrec-env.sh: $*"; }

# Removes least recently used ready environments (not $1) until the ones left, uv's cache and a
# new one fit in the budget; then uv's cache, if that is not enough.
make_room() {
  local keep=$1 total d removed
  while :; do
    # One du over them all: a file shared as hard links counts once.
    local counted=()
    compgen -G "$root/torchrec-*/" >/dev/null && counted+=("$root"/torchrec-*/)
    [ -d "$UV_CACHE_DIR" ] && counted+=("$UV_CACHE_DIR")
    total=0
    [ ${#counted[@]} -gt 0 ] && total=$(du -smc "${counted[@]}" | tail -n 1 | cut -f1)
    (( total + env_mb <= budget_mb )) && return 0
    # Ready environments, least recently used first (dmpcheck-last-used, else when it was made).
    removed=""
    while read -r d; do
      [ -n "$d" ] || continue
      # A dmpcheck cell running on it holds dmpcheck-in-use.lock shared: then it stays.  Held
      # exclusively here while it is removed, so no cell starts on it half-removed.
      if flock -n -x "$d/dmpcheck-in-use.lock" rm -rf "$d" 2>/dev/null; then
        say "removed the least recently used environment $d to stay within ${budget_mb} MB (DMPCHECK_TORCHREC_BUDGET_GB)"
        removed=$d; break
      fi
    done < <(for d in "$root"/torchrec-*/; do
               d=${d%/}
               [ -f "$d/dmpcheck-ready.json" ] && [ "$d" != "$root/$keep" ] || continue
               used=$d/dmpcheck-last-used; [ -f "$used" ] || used=$d/dmpcheck-ready.json
               printf '%s\t%s\n' "$(stat -c %Y "$used")" "$d"
             done | sort -n | cut -f2)
    [ -n "$removed" ] && continue
    if [ -d "$UV_CACHE_DIR" ]; then
      say "cleared uv's cache $UV_CACHE_DIR to stay within ${budget_mb} MB (the environments keep their files)"
      rm -rf "$UV_CACHE_DIR"; continue
    fi
    echo "ci/torchrec-env.sh: the environments take ${total} MB of the ${budget_mb} MB budget and none can go (every other one is in use by a running dmpcheck); creating $keep over budget" >&2
    return 0
  done
}
releases() { grep -v '^#' "$pins" | awk -F'\t' 'NF>=3 {print $1}'; }
row() { grep -v '^#' "$pins" | awk -F'\t' -v r="$1" '$1==r' || true; }

# uv, from PATH or installed once beside the environments; empty: plain pip (said once).
uv=""
find_uv() {
  [ "${DMPCHECK_TORCHREC_INSTALLER_TOOL:-uv}" = pip ] && { say "making environments with venv and pip (DMPCHECK_TORCHREC_INSTALLER_TOOL=pip)"; return; }
  if command -v uv >/dev/null; then uv=$(command -v uv); return; fi
  if [ ! -x "$root/uv/bin/uv" ]; then
    say "installing uv (once) into $root/uv"
    rm -rf "$root/uv"
    if ! { "$default_python" -m venv "$root/uv" && "$root/uv/bin/python" -m pip install -q --disable-pip-version-check uv; }; then
      rm -rf "$root/uv"
      say "uv could not be installed: making environments with venv and pip instead (slower, no files shared)" >&2
      return
    fi
  fi
  uv=$root/uv/bin/uv
}

# The interpreter python==3.N names: python3.N on PATH, else pyenv's newest 3.N.
find_python() {
  local want=$1 found=""
  found=$(command -v "python$want" 2>/dev/null || true)
  if [ -z "$found" ]; then
    local pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
    found=$(ls -d "$pyenv_root"/versions/"$want".*/bin/python3 2>/dev/null | sort -V | tail -n 1 || true)
  fi
  [ -n "$found" ] || { echo "ci/torchrec-env.sh: python==$want: no python$want on PATH and none under ${PYENV_ROOT:-$HOME/.pyenv}/versions" >&2; return 1; }
  echo "$found"
}

if [ $# -eq 0 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then usage; exit 0; fi
if [ "$1" = "--list" ]; then
  printf '%-8s %-8s %-14s %s\n' torchrec torch fbgemm-gpu-cpu environment
  grep -v '^#' "$pins" | while IFS=$'\t' read -r trec torch fbgemm _; do
    state="missing (bash ci/torchrec-env.sh $trec)"
    [ -f "$root/torchrec-$trec/dmpcheck-ready.json" ] && state="ready: $root/torchrec-$trec"
    printf '%-8s %-8s %-14s %s\n' "$trec" "$torch" "$fbgemm" "$state"
  done
  for d in "$root"/torchrec-*+*/; do
    [ -f "$d/dmpcheck-ready.json" ] && printf '%-32s ready: %s\n' "(a set of pins)" "${d%/}"
  done
  exit 0
fi
wanted=("$@")
[ "$1" = "all" ] && mapfile -t wanted < <(releases)

mkdir -p "$root"
find_uv
status=0
for want in "${wanted[@]}"; do
  # The system: "X.Y.Z", or "torchrec==X.Y.Z NAME==VERSION ...".
  read -r -a words <<<"$want"
  trec=${words[0]#torchrec==}
  declare -A pin=()
  bad=""
  for w in "${words[@]:1}"; do
    name=$(echo "${w%%==*}" | tr 'A-Z_.' 'a-z--'); version=${w#*==}
    if [[ "$w" != *==* ]] || [[ ! "$name" =~ ^[a-z0-9][a-z0-9-]*$ ]] || [ "$name" = torchrec ] || [[ ! "$version" =~ ^[0-9][A-Za-z0-9.+]*$ ]]; then
      bad="'$w' is not NAME==VERSION"; break
    fi
    pin[$name]=$version
  done
  line=$(row "$trec")
  if [ -n "$bad" ] || [ -z "$line" ]; then
    [ -n "$bad" ] && echo "ci/torchrec-env.sh: '$want': $bad" >&2 ||
      echo "ci/torchrec-env.sh: torchrec $trec is not in $pins; pinned releases: $(releases | tr '\n' ' ')" >&2
    status=2; continue
  fi
  IFS=$'\t' read -r _ torch fbgemm others <<<"$line"
  read -r -a extra <<<"$others"; [ "$others" = "-" ] && extra=()
  # The folder: the release, then each pin in name order (the name dmpcheck gives the system).
  name="torchrec-$trec"; label="torchrec $trec"
  for k in $(printf '%s\n' "${!pin[@]}" | sort); do name+="+$k=${pin[$k]}"; label+=", $k ${pin[$k]}"; done
  if [ -n "${pin[fbgemm-gpu-cpu]:-}" ] && [ -z "${pin[torch]:-}" ]; then
    paired=$(grep -v '^#' "$pins" | awk -F'\t' -v f="${pin[fbgemm-gpu-cpu]}" '$3==f {t=$2} END {print t}')
    if [ -z "$paired" ]; then
      echo "ci/torchrec-env.sh: $label: no row of $pins pins fbgemm-gpu-cpu ${pin[fbgemm-gpu-cpu]}, so which torch it needs is not known: pin torch too" >&2
      status=2; continue
    fi
    torch=$paired
  fi
  [ -n "${pin[torch]:-}" ] && torch=${pin[torch]}
  [ -n "${pin[fbgemm-gpu-cpu]:-}" ] && fbgemm=${pin[fbgemm-gpu-cpu]}
  python=$default_python; want_python=""
  for e in "${extra[@]}"; do [[ "$e" == python==* ]] && want_python=${e#python==}; done
  [ -n "${pin[python]:-}" ] && want_python=${pin[python]}
  if [ -n "$want_python" ] && ! python=$(find_python "$want_python"); then status=2; continue; fi
  # The row's other pins, a pinned package of the same name replacing its own; then the rest.
  reqs=("torch==$torch" "fbgemm-gpu-cpu==$fbgemm")
  for e in "${extra[@]}"; do
    [[ "$e" == python==* ]] && continue
    base=$(echo "${e%%[<>=!~]*}" | tr 'A-Z_.' 'a-z--')
    [ -n "${pin[$base]:-}" ] || reqs+=("$e")
  done
  for k in "${!pin[@]}"; do
    case $k in torch|fbgemm-gpu-cpu|python) ;; *) reqs+=("$k==${pin[$k]}") ;; esac
  done
  env_dir="$root/$name"
  if [ -f "$env_dir/dmpcheck-ready.json" ]; then
    say "$label ready in $env_dir"; continue
  fi
  # One creator per environment at a time; whoever waited finds it ready.
  exec {lock}>"$root/.$name.lock"
  flock "$lock"
  if [ -f "$env_dir/dmpcheck-ready.json" ]; then
    say "$label ready in $env_dir (made meanwhile by another process)"
    exec {lock}>&-; continue
  fi
  make_room "$name"
  start=$(date +%s)
  say "creating $env_dir with $([ -n "$uv" ] && echo uv || echo pip) ($python; ${reqs[*]}; torchrec==$trec without its dependencies)"
  rm -rf "$env_dir"
  ok=1
  if [ -n "$uv" ]; then
    # Hard links from uv's cache (same file system as the environments); torchrec itself without
    # its dependencies: its metadata asks for the GPU fbgemm-gpu, whose files would replace
    # fbgemm-gpu-cpu's.
    "$uv" venv -q --python "$python" "$env_dir" &&
      "$uv" pip install -q --python "$env_dir/bin/python" --link-mode hardlink "${reqs[@]}" &&
      "$uv" pip install -q --python "$env_dir/bin/python" --link-mode hardlink --no-deps "torchrec==$trec" || ok=0
  else
    pip=("$env_dir/bin/python" -m pip --disable-pip-version-check -q)
    "$python" -m venv "$env_dir" && "${pip[@]}" install "${reqs[@]}" &&
      "${pip[@]}" install --no-deps "torchrec==$trec" || ok=0
  fi
  if [ $ok = 0 ]; then
    echo "ci/torchrec-env.sh: the installer failed for $label (its words above); $env_dir left without dmpcheck-ready.json (run again to retry)" >&2
    status=1; exec {lock}>&-; continue
  fi
  # The marker is the rank program's probe answer (a contract document: the versions the imports
  # report), written only when torch, fbgemm_gpu and torchrec import together.
  if ! OMP_NUM_THREADS=1 PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="${DMPCHECK_TORCHREC_SUT:-$PWD/torchrec_sut}" \
       "$env_dir/bin/python" -m dmpcheck_torchrec.probe "$env_dir/dmpcheck-ready.json.tmp"
  then
    echo "ci/torchrec-env.sh: $label installed but does not import (see above); not marked ready" >&2
    status=1; exec {lock}>&-; continue
  fi
  echo "  imported: $(cat "$env_dir/dmpcheck-ready.json.tmp")"
  mv "$env_dir/dmpcheck-ready.json.tmp" "$env_dir/dmpcheck-ready.json"
  exec {lock}>&-
  say "$label ready in $env_dir ($(( $(date +%s) - start )) s)"
done
exit $status
