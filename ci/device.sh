#!/usr/bin/env bash
# The GPU checks, prepared as one script for the machine that may be lent (the device tool: one
# H200, torch 2.11 with CUDA 13 in its python3, CMake, ninja, no package registry, 15 minutes of
# device time in all).  It builds dmpcheck against that python3's libtorch with NCCL, using the
# build dependencies carried in build-device-deps/ (bash ci/device-deps.sh), then runs:
#   1. the NCCL communicator's tests at world size 1 (one GPU: NCCL will not put two ranks on it):
#      init, every collective, staging through device buffers, refused calls; beside Gloo's;
#   2. the unit tests against that libtorch;
#   3. `dmpcheck bench` on NCCL and on Gloo, every collective, 1 KiB to 256 MiB;
#   4. the scenario cells that can run there: ci/device/one-gpu.yaml (NCCL and Gloo side by side)
#      and the reference cells of scenarios/ (release cells need release environments: skipped).
# Logs, JSON and reports go to --logs (build-device/out); summary.json is rewritten after every
# step.  With $OUT set (the device tool's folder that comes back: at most 8 files, 2 folders
# down), summary.json, bench.json and everything else packed as device-logs.tar.gz go there too,
# whatever happens.  The whole run keeps within --deadline seconds (480: the device tool allows
# 600 per command), each step within its own limit and what is left.  Without a GPU it is a dry
# run: the same steps, and what needs the GPU is skipped with the reason; ci/test.sh runs it so.
#
#   bash ci/device.sh [--python PY] [--deps DIR] [--build-dir DIR] [--logs DIR] [--jobs N]
#                     [--deadline S] [--dry-run | --require-gpu] [--mask-system-deps]
#   --require-gpu       fail, instead of a dry run, where torch sees no GPU (for the real call)
#   --mask-system-deps  (root) hide this machine's own copies of the carried packages in a private
#                       mount namespace, so that the build can only use build-device-deps/, as on
#                       the device, where they do not exist
{  # bash reads the whole block before running it: editing this file mid-run cannot change the run
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=python3
deps=build-device-deps
build=build-device
out=build-device/out
back=${OUT:-}
jobs=$(nproc)
mode=auto
mask=0
deadline=
usage() { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --python) python=$2; shift 2 ;;
    --deps) deps=$2; shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    --logs) out=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --deadline) deadline=$2; shift 2 ;;
    --dry-run) mode=dry; shift ;;
    --require-gpu) mode=gpu; shift ;;
    --mask-system-deps) mask=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "ci/device.sh: unknown argument '$1'"; usage; exit 2 ;;
  esac
done
[[ -d $deps/usr ]] || { echo "ci/device.sh: no carried dependencies in $deps (run bash ci/device-deps.sh here and carry $deps)"; exit 2; }
deps=$(cd "$deps" && pwd)

# The Debian packages' own copies, hidden by --mask-system-deps (bind mounts in a private mount
# namespace: an empty folder over each folder, /dev/null over each file).
masked=(/usr/include/yaml-cpp /usr/include/nlohmann /usr/include/CLI /usr/include/fmt /usr/include/gtest
        /usr/include/gmock /usr/lib/x86_64-linux-gnu/cmake/yaml-cpp /usr/lib/x86_64-linux-gnu/cmake/fmt
        /usr/lib/x86_64-linux-gnu/cmake/GTest /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json)
if [[ $mask == 1 && -z ${DMPCHECK_DEVICE_MASKED:-} ]]; then
  [[ $(id -u) == 0 ]] || { echo "ci/device.sh: --mask-system-deps needs root (a mount namespace)"; exit 2; }
  again=(--python "$python" --deps "$deps" --build-dir "$build" --logs "$out" --jobs "$jobs")
  [[ -n $deadline ]] && again+=(--deadline "$deadline")
  [[ $mode == dry ]] && again+=(--dry-run)
  [[ $mode == gpu ]] && again+=(--require-gpu)
  exec env DMPCHECK_DEVICE_MASKED=1 unshare --mount --propagation private bash "$0" "${again[@]}"
fi
if [[ -n ${DMPCHECK_DEVICE_MASKED:-} ]]; then
  empty=$(mktemp -d)
  for path in "${masked[@]}"; do
    [[ -d $path ]] && mount --bind "$empty" "$path"
  done
  for f in /usr/lib/x86_64-linux-gnu/lib{yaml-cpp,fmt,gtest,gtest_main,gmock,gmock_main}.{so,a} \
           /usr/lib/x86_64-linux-gnu/libyaml-cpp.so.0.7* /usr/lib/x86_64-linux-gnu/libfmt.so.9*; do
    [[ -e $f && ! -L $f ]] && mount --bind /dev/null "$f"
  done
  # Proof that the hiding took: the headers a build would otherwise fall back on are gone.
  if echo '#include <yaml-cpp/yaml.h>' | c++ -x c++ -fsyntax-only - 2> /dev/null; then
    echo "ci/device.sh: --mask-system-deps: this machine's yaml-cpp is still visible"; exit 1
  fi
  echo "ci/device.sh: this machine's copies of the carried packages are hidden (${#masked[@]} folders and their libraries)"
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
if [[ -n $(ls -A "$out") && ! -e $out/steps.jsonl ]]; then
  echo "ci/device.sh: --logs $out holds files that are not an earlier run's logs; give an empty folder"; exit 2
fi
rm -rf "${out:?}"/*
: > "$out/steps.jsonl"
started=$(date +%s)
failed=0
dry=1
deadline_given=$deadline
deadline=${deadline:-480}  # until the probe has said whether this is a dry run

# summary.json from the steps so far; with $OUT, it and the rest go back (on every exit too).
summarise() {
  "$python" - "$out" "$dry" "$(( $(date +%s) - started ))" "$1" <<'EOF' || true
import json, sys
out, dry, seconds, state = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), sys.argv[4]
steps = [json.loads(l) for l in open(out + "/steps.jsonl")]
json.dump({"dry_run": dry, "seconds": seconds, "state": state, "steps": steps}, open(out + "/summary.json", "w"), indent=1)
EOF
}
bring_back() {
  [[ -n $back ]] || return 0
  mkdir -p "$back"
  cp "$out/summary.json" "$back/" 2> /dev/null || true
  cp "$out/bench.json" "$back/" 2> /dev/null || true
  tar -C "$(dirname "$out")" -czf "$back/device-logs.tar.gz" "$(basename "$out")" 2> /dev/null || true
}
trap 'summarise ended; bring_back' EXIT

# record NAME STATUS SECONDS DETAIL: one line of steps.jsonl, one line on the terminal.
record() {
  "$python" -c 'import json, sys; print(json.dumps({"step": sys.argv[1], "status": sys.argv[2], "seconds": float(sys.argv[3]), "detail": sys.argv[4]}))' \
    "$1" "$2" "$3" "$4" >> "$out/steps.jsonl"
  printf 'ci/device.sh: %-12s %-7s %5s s  %s\n' "$1" "$2" "$3" "$4"
  [[ $2 != failed ]] || failed=1
  summarise running
}
# step NAME LIMIT_S FUNCTION: runs FUNCTION in a bash of its own (set -euo pipefail) with its
# output in $out/NAME.log, killed with all it started past LIMIT_S seconds (timeout signals its
# process group).  FUNCTION prints "DETAIL: ..." for the summary, and "SKIP: reason" when what it
# checks could not run here.
step() {
  local name=$1 limit=$2 fn=$3 t0 rc=0 detail="" skip seconds left
  left=$(( started + deadline - $(date +%s) - 15 ))
  if (( left < 20 )); then
    record "$name" failed 0 "not run: the run's ${deadline} s deadline is spent"
    return
  fi
  (( limit <= left )) || limit=$left
  t0=$(date +%s.%N)
  timeout -k 10 "$limit" bash -c "set -euo pipefail; $fn" > "$out/$name.log" 2>&1 < /dev/null || rc=$?
  [[ $rc != 124 ]] || detail="ran past its ${limit} s"
  [[ $rc == 124 ]] || detail=$(sed -n 's/^DETAIL: //p' "$out/$name.log" | tail -n 1)
  skip=$(sed -n 's/^SKIP: //p' "$out/$name.log" | tail -n 1)
  seconds=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [[ $rc != 0 ]]; then
    record "$name" failed "$seconds" "${detail:-exit $rc}; log: $name.log"
    tail -n 25 "$out/$name.log" | sed 's/^/    /'
  elif [[ -n $skip ]]; then
    record "$name" skipped "$seconds" "$skip"
  else
    record "$name" passed "$seconds" "$detail"
  fi
}
export python deps build out jobs root

# -- 0. what this machine is -------------------------------------------------------------------------
probe() {
  uname -srm
  ldd --version | head -n 1 || true
  local tool
  for tool in c++ cmake ninja nvcc git; do
    if command -v "$tool" > /dev/null; then echo "$tool: $("$tool" --version | grep -m 1 -i -E 'version|[0-9]\.[0-9]')"; else echo "$tool: not found"; fi
  done
  nvidia-smi -L || true
  "$python" - <<'EOF'
import torch
print("torch", torch.__version__, "at", torch.__file__)
print("cuda available:", torch.cuda.is_available(), "devices:", torch.cuda.device_count())
if torch.cuda.is_available():
    print("device 0:", torch.cuda.get_device_name(0), "nccl", ".".join(map(str, torch.cuda.nccl.version())))
EOF
}
export -f probe
step probe 60 probe
gpu_reason=""
if ! "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" > /dev/null 2>&1; then
  gpu_reason="torch in $python sees no CUDA GPU"
fi
if [[ $mode == gpu && -n $gpu_reason ]]; then
  echo "ci/device.sh: --require-gpu, but $gpu_reason"; exit 1
fi
[[ $mode == dry || -n $gpu_reason ]] && dry=1 || dry=0
# A dry run on 2 cores with a cold ccache builds for some 12 minutes; a GPU run must end within the
# device tool's 600 s per command, leaving time to bring its files back.
[[ -n $deadline_given ]] || deadline=$([[ $dry == 1 ]] && echo 3600 || echo 480)
git_found=$(command -v git > /dev/null && echo 1 || echo 0)
export dry git_found
echo "ci/device.sh: $([[ $dry == 1 ]] && echo "DRY RUN (${gpu_reason:-asked for}): what needs the GPU is skipped" || echo "GPU run") on $(uname -n), $jobs jobs, deadline $deadline s, logs in $out${back:+, brought back to $back}"
sed 's/^/    /' "$out/probe.log"

# -- 1. build ----------------------------------------------------------------------------------------
configure() {
  local arch=usr/lib/x86_64-linux-gnu/cmake
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDMPCHECK_TORCH_PYTHON="$(command -v "$python")" \
    -DDMPCHECK_BUILD_TESTS=ON -DDMPCHECK_WITH_BENCHMARKS=OFF -DDMPCHECK_WITH_PYTHON=OFF \
    -Dyaml-cpp_DIR="$deps/$arch/yaml-cpp" -Dfmt_DIR="$deps/$arch/fmt" -DGTest_DIR="$deps/$arch/GTest" \
    -DCLI11_DIR="$deps/usr/share/cmake/CLI11" -Dnlohmann_json_DIR="$deps/usr/share/cmake/nlohmann_json"
  # Every carried package was taken from the carried folder.
  for pkg in yaml-cpp fmt GTest CLI11 nlohmann_json; do
    grep -q "^${pkg}_DIR:[A-Z]*=$deps/" "$build/CMakeCache.txt" || { echo "$pkg was not found in $deps"; return 1; }
  done
  if grep -q "^DMPCHECK_WITH_NCCL:BOOL=ON" "$build/CMakeCache.txt" && grep -q "NCCL backend on" "$out/configure.log"; then
    echo "DETAIL: NCCL on: $(sed -n 's/.*NCCL backend on (\(.*\))/\1/p' "$out/configure.log")"
  elif [[ $dry == 0 ]]; then
    echo "NCCL was not found beside $python's torch nor under CUDA_HOME: the GPU checks need it"; return 1
  else
    echo "DETAIL: NCCL off (not found), its tests will say so"
  fi
}
build_it() {
  cmake --build "$build" --target dmpcheck dmpcheck_unit_tests -- -j"$jobs"
  # The libraries resolve where they should: the carried ones, and the torch the build was made for.
  local torch_lib
  torch_lib=$("$python" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
  ldd "$build/harness/dmpcheck" | tee "$out/ldd.txt"
  ! grep -q "not found" "$out/ldd.txt" || { echo "a library is not found"; return 1; }
  grep -q "libyaml-cpp.so.0.7 => $deps/" "$out/ldd.txt" || { echo "libyaml-cpp is not the carried one"; return 1; }
  local nccl
  nccl=$(sed -n 's/^DMPCHECK_NCCL_LIBRARY:FILEPATH=//p' "$build/CMakeCache.txt")
  if [[ -n $nccl && $nccl != *NOTFOUND ]]; then
    grep -q "libnccl.so.2 => $(dirname "$nccl")/" "$out/ldd.txt" || { echo "libnccl is not the one configured, $nccl"; return 1; }
  fi
  grep -q "libtorch_cpu.so => $torch_lib/" "$out/ldd.txt" || { echo "libtorch is not $torch_lib's"; return 1; }
  echo "DETAIL: dmpcheck and dmpcheck_unit_tests; yaml-cpp from $(basename "$deps"), libtorch from $python's torch"
}
export -f configure build_it
step configure 300 configure
# 16 cores build it in a few minutes; a dry run on 2 cores with a cold ccache takes some 12.
[[ $failed == 0 ]] && step build "$([[ $dry == 1 ]] && echo 1800 || echo 300)" build_it
if [[ $failed != 0 ]]; then
  echo "ci/device.sh: the build failed; nothing else can run (logs in $out)"
  exit 1
fi
bin=$build/harness
export bin

# gtest_result FILTER NAME: runs the unit tests that FILTER selects; fails on a failure, and on a
# GPU run where a test that needs the GPU (GPU_TESTS in harness/tests/CMakeLists.txt) skipped.
# GoogleTest's JSON has no skip message: the reasons come from its text output.
gtest_result() {
  "$bin/tests/dmpcheck_unit_tests" --gtest_filter="$1" --gtest_output=json:"$out/$2.json" --gtest_color=no \
    | tee "$out/$2.txt" || return 1
  "$python" - "$out/$2.json" "$out/$2.txt" "$dry" <<'EOF'
import fnmatch, json, re, sys
report, text, dry = json.load(open(sys.argv[1])), open(sys.argv[2]).read(), sys.argv[3] == "1"
why = {name: reason.strip() for reason, name in re.findall(r": Skipped\n(.*?)\[  SKIPPED \] (\S+)", text, re.S)}
ran, skipped = [], []
for suite in report["testsuites"]:
    for t in suite["testsuite"]:
        name = suite["name"] + "." + t["name"]
        (skipped if t.get("result") == "SKIPPED" else ran).append(name)
for name in skipped:
    print("skipped:", name, "-", why.get(name, "(no reason printed)"))
needs_gpu = [n for n in skipped if fnmatch.fnmatch(n, "NcclCollectives.Every*") or fnmatch.fnmatch(n, "NcclCollectives.ErrorPaths*")]
if needs_gpu and not dry:
    print("on a GPU run these skipped:", needs_gpu); sys.exit(1)
print("DETAIL: %d ran, %d skipped" % (len(ran), len(skipped)))
if needs_gpu:
    print("SKIP: %d ran; %d NCCL test(s) skipped: %s" % (len(ran), len(needs_gpu), why.get(needs_gpu[0], "(no reason printed)")))
EOF
}

# -- 2. tests ----------------------------------------------------------------------------------------
nccl_tests() { gtest_result 'NcclCollectives.*:GlooCollectives.*' collectives; }
unit_tests() {
  # The NCCL ones ran above; TorchRecRepositoryTest makes git repositories (git may be absent).
  local filter='*-NcclCollectives.*'
  [[ $git_found == 1 ]] || { filter+=':TorchRecRepositoryTest.*'; echo "no git here: TorchRecRepositoryTest.* not run"; }
  gtest_result "$filter" unit
}
export -f gtest_result nccl_tests unit_tests
step collectives 180 nccl_tests
step unit 240 unit_tests

# -- 3. bench ----------------------------------------------------------------------------------------
bench() {
  local max=256M iters=20
  [[ $dry == 1 ]] && max=1M && iters=5
  "$bin/dmpcheck" bench -c all --backend gloo,nccl -g 1 -b 1K -e "$max" -f 4 -w 2 -n "$iters" --json "$out/bench.json"
  "$python" - "$out/bench.json" "$dry" <<'EOF'
import json, sys
groups, dry = json.load(open(sys.argv[1])), sys.argv[2] == "1"
groups = groups["groups"]
skipped = [g for g in groups if g.get("skipped")]
for g in groups:
    if g.get("skipped"):
        continue
    wrong = sum(row.get("wrong", 0) for row in g["rows"])
    assert not g["error"] and wrong == 0, ("wrong results", g["backend"], g["error"], wrong)
ran = {g["backend"] for g in groups if not g.get("skipped")}
assert "gloo" in ran, "gloo did not run"
if not dry:
    assert "nccl" in ran and not skipped, ("a GPU run skipped", [(g["backend"], g["skip_reason"]) for g in skipped])
print("DETAIL: %d group(s) ran (%s), no wrong element" % (len(groups) - len(skipped), ", ".join(sorted(ran))))
if skipped:
    print("SKIP: gloo ran, no wrong element; nccl skipped: %s" % skipped[0]["skip_reason"])
EOF
}
export -f bench
step bench 150 bench

# -- 4. scenarios ------------------------------------------------------------------------------------
one_gpu() {
  local code=0
  "$bin/dmpcheck" run ci/device/one-gpu.yaml --out "$out/one-gpu" --quiet || code=$?
  "$python" - "$out/one-gpu/one-gpu-world-1" "$dry" "$code" <<'EOF'
import glob, json, os, sys
folder, dry, code = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
got = {os.path.basename(f)[:-5]: json.load(open(f)) for f in glob.glob(os.path.join(folder, "*.json"))}
verdicts = {k: r["verdict"] for k, r in got.items()}
print(verdicts)
assert len(got) == 6, sorted(got)
for k, r in got.items():
    nccl = r["environment"]["backend"] == "nccl"
    want = ("pass", "skipped") if (dry and nccl) else ("pass",)
    assert r["verdict"] in want, (k, r["verdict"], r.get("failure"), r.get("skip_reason"))
assert code == 0, "dmpcheck run exited %d" % code
reason = next((r["skip_reason"] for r in got.values() if r["verdict"] == "skipped"), None)
print("DETAIL: %d of 6 cells passed" % sum(v == "pass" for v in verdicts.values()))
if reason:
    print("SKIP: the Gloo cells passed; NCCL's skipped: %s" % reason)
EOF
}
suite() {
  # No release environments there: the release cells skip, saying which command installs them.
  DMPCHECK_TORCHREC_ENVS=$out/no-release-environments "$bin/dmpcheck" suite scenarios/regressions scenarios/examples \
    --out "$out/suite" -j "$(( jobs > 3 ? jobs / 2 : 1 ))" | tee "$out/suite.txt"
  echo "DETAIL: $(sed -n 's/^dmpcheck suite: //p' "$out/suite.txt")"
}
export -f one_gpu suite
step one-gpu 120 one_gpu
step suite 240 suite

summarise done
echo "ci/device.sh: $([[ $failed == 0 ]] && echo passed || echo FAILED) in $(( $(date +%s) - started )) s ($([[ $dry == 1 ]] && echo dry run || echo GPU run)); $out/summary.json"
exit "$failed"
}
