#!/usr/bin/env bash
# Fuzzes the scenario loader and KJT validation with libFuzzer (clang, ASan, UBSan) for a set
# time per target: bash ci/fuzz.sh [SECONDS per target, default 60].  New corpus entries go to
# build-fuzz/corpus/<target>/, crashes to build-fuzz/crashes/<target>/ (the script fails if any).
# Copy a crash into fixtures/fuzz/<target>/ once fixed: CTest replays that corpus on every build.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
bash ci/setup.sh
if ! dpkg-query -W -f='${Status}' clang libclang-rt-14-dev 2>/dev/null | grep -q "install ok installed"; then
  sudo_cmd=(); [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq clang libclang-rt-14-dev >/dev/null
fi
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fsanitize=fuzzer-no-link" \
  -DDMPCHECK_FUZZ=ON -DDMPCHECK_BUILD_TESTS=OFF -DDMPCHECK_WITH_PYTHON=OFF -DDMPCHECK_USE_PCH=OFF >/dev/null
cmake --build build-fuzz --target scenario_loader_fuzz kjt_fuzz exchange_fuzz
status=0
for target in scenario_loader kjt exchange; do
  mkdir -p "build-fuzz/corpus/$target" "build-fuzz/crashes/$target"
  cp -n fixtures/fuzz/$target/* "build-fuzz/corpus/$target/" 2>/dev/null || true
  echo "ci/fuzz.sh: $target for ${seconds} s"
  # detect_leaks=0: libtorch's static registries are reported as leaks at exit.
  ASAN_OPTIONS=detect_leaks=0 "build-fuzz/harness/fuzz/${target}_fuzz" "build-fuzz/corpus/$target" \
    -max_total_time="$seconds" -artifact_prefix="build-fuzz/crashes/$target/" -print_final_stats=1 2>&1 \
    | grep -E "^#[0-9]+.*(DONE|pulse)|stat::number_of_executed_units|ERROR|SUMMARY|crash-" | tail -6 || true
  if [ -n "$(ls -A "build-fuzz/crashes/$target")" ]; then
    echo "ci/fuzz.sh: $target found crashes: $(ls "build-fuzz/crashes/$target")"
    status=1
  fi
done
exit $status
