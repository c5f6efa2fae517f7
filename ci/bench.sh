#!/usr/bin/env bash
# The benchmarks behind docs/performance.md, all in one run, each printing its ratios measured
# side by side.  Outputs (tables, JSON) go to reports/bench/<timestamp>/.  About 23 minutes once built
# on 2 cores (measured 2026-12-03, 19:09; section 5's interleaved pairs, the whole suite cold and warm among
# them, are most of it); the 1 GiB scenario needs several GiB of memory per rank.  Pass --quick to
# skip it.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[[ "${1:-}" == "--quick" ]] && quick=1
bash ci/setup.sh
# The reporter's script of the seed needs real torchrec 0.6.0 (section 5); it installs while the
# build compiles.
bash ci/torchrec-env.sh 0.6.0 > "${TMPDIR:-/tmp}/dmpcheck-torchrec-env.log" 2>&1 &
env_pid=$!
bash ci/build.sh
env_status=0
wait "$env_pid" || env_status=$?
build=${DMPCHECK_BUILD_DIR:-build}
dmpcheck=$build/harness/dmpcheck
out=reports/bench/$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
echo "== benchmarks into $out"

echo "== 1. collective sweep, nccl-tests style (Gloo; NCCL where a GPU is present)"
"$dmpcheck" bench --collective broadcast -b 1K -e 64M -f 4 --backend gloo,nccl --json "$out/broadcast-sweep.json" \
  | tee "$out/broadcast-sweep.txt"
"$dmpcheck" bench --collective all -b 1K -e 16M -f 16 -g 2,4 --backend gloo,nccl --json "$out/all-collectives.json" \
  | tee "$out/all-collectives.txt"

echo "== 2. bar: 256 data-parallel 64x64 tables, coalesced vs one broadcast per table"
"$dmpcheck" bench --scenario benchmarks/dp-256-small-tables.yaml -w 2 -n 20 --json "$out/dp-256-small-tables.json" \
  | grep -v '^probe ' | tee "$out/dp-256-small-tables.txt"

if [[ $quick == 0 ]]; then
  echo "== 3. bar: 4 data-parallel 1M x 64 tables, coalesced vs raw and vs c10d::broadcast_coalesced"
  "$dmpcheck" bench --scenario benchmarks/dp-4-large-tables.yaml -w 1 -n 5 --json "$out/dp-4-large-tables.json" \
    | grep -v '^probe ' | tee "$out/dp-4-large-tables.txt"
fi

echo "== 4. bars: DMP step overhead at world 1; fused optimizers against memcpy (Google Benchmark)"
"$build/harness/bench/dmpcheck_microbench" --benchmark_color=false --benchmark_out="$out/microbench.json" \
  --benchmark_out_format=json | tee "$out/microbench.txt"
echo "== 5. bars: dmpcheck against the reporter's own script on real torchrec 0.6.0, and warm (forked) ranks"
echo "      against exec-ed ones for the regression suite (benchmarks/vs_torchrec.py, 5 interleaved pairs)"
if [[ $env_status == 0 ]]; then
  /usr/bin/python3 benchmarks/vs_torchrec.py --dmpcheck "$dmpcheck" --json "$out/vs-torchrec.json" | tee "$out/vs-torchrec.txt"
else
  echo "skipped: the torchrec 0.6.0 environment did not install (${TMPDIR:-/tmp}/dmpcheck-torchrec-env.log)"
fi
echo "== done: $out"
