#!/usr/bin/env bash
# Fuzzes what a user or a release hands dmpcheck: scenario files, KJTs, the release exchange, batch
# files, checkpoints and the rank program's documents (harness/fuzz/*_fuzz.cc), each target for a
# set time, starting from its corpus under fixtures/fuzz/<target>/.
#
#   bash ci/fuzz.sh [SECONDS]            libFuzzer with ASan and UBSan (clang; a fourth build,
#                                        build-fuzz/; default 60 s a target).  New corpus entries go
#                                        to build-fuzz/corpus/<target>/, crashes to
#                                        build-fuzz/crashes/<target>/.
#   bash ci/fuzz.sh --mutate [SECONDS]   the targets as build/ has them (gcc, no sanitizer;
#                                        default 20 s a target): random edits and splices of the
#                                        corpus, an 8 GiB address-space limit (a few bytes must not
#                                        ask for gigabytes) and 10 s an input (more is a hang).  The
#                                        input that crashed or hung is kept in
#                                        build/fuzz-artifacts/<target>/.  The seed is the date,
#                                        printed, so a run can be repeated: FUZZ_SEED=N.
#   bash ci/fuzz.sh --runs [N]           the same, N mutants a target (default 20000) whatever time
#                                        they take, seeded by the commit's tree (`git rev-parse
#                                        HEAD^{tree}`, or FUZZ_SEED=N): what `.ci/run` runs, so its
#                                        verdict is the commit's own, the same on any machine and on
#                                        any day, and a new tree draws new inputs.
#
# Fails if any target crashed or hung.  Copy such an input into fixtures/fuzz/<target>/ once fixed:
# CTest replays that corpus on every build.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(scenario_loader kjt exchange batch_file checkpoint contract)

if [ "${1:-}" = "--mutate" ] || [ "${1:-}" = "--runs" ]; then
  if [ "$1" = "--mutate" ]; then
    bound=(--mutate "${2:-20}")
    seed=${FUZZ_SEED:-$(date +%Y%m%d)}
  else
    bound=(--runs "${2:-20000}")
    if [ -z "${FUZZ_SEED:-}" ]; then
      tree=$(git rev-parse --verify -q 'HEAD^{tree}' 2>/dev/null) ||
        { echo "ci/fuzz.sh: --runs is seeded by the commit's tree, and git names none here: give FUZZ_SEED=N" >&2; exit 2; }
    fi
    seed=${FUZZ_SEED:-$((16#${tree:0:12}))}
  fi
  status=0
  # Each target runs with a TMPDIR of its own that must be empty when it exits: a fuzzer that
  # leaves a directory per run fills /tmp on a CI machine (the exchange target did).
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  for target in "${targets[@]}"; do
    binary=build/harness/fuzz/${target}_fuzz
    [ -x "$binary" ] || { echo "ci/fuzz.sh: $binary is not built (bash ci/build.sh first)" >&2; exit 2; }
    artifacts=build/fuzz-artifacts/$target
    rm -rf "$artifacts"
    if ! TMPDIR=$scratch "$binary" "${bound[@]}" --seed "$seed" --artifacts "$artifacts" "fixtures/fuzz/$target"; then
      echo "ci/fuzz.sh: $target FAILED with seed $seed (again: FUZZ_SEED=$seed bash ci/fuzz.sh ${bound[*]}): the input is $artifacts/$(ls "$artifacts" | grep -m1 -E '^hang$' || echo current)" >&2
      status=1
    fi
    if [ -n "$(ls -A "$scratch")" ]; then
      echo "ci/fuzz.sh: $target left behind in its TMPDIR: $(ls -A "$scratch" | tr '\n' ' ')" >&2
      rm -rf "${scratch:?}"/* "${scratch:?}"/.[!.]* 2>/dev/null || true
      status=1
    fi
  done
  exit $status
fi

seconds=${1:-60}
bash ci/setup.sh
if ! dpkg-query -W -f='${Status}' clang libclang-rt-14-dev 2>/dev/null | grep -q "install ok installed"; then
  sudo_cmd=(); [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq clang libclang-rt-14-dev >/dev/null
fi
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fsanitize=fuzzer-no-link" \
  -DDMPCHECK_FUZZ=ON -DDMPCHECK_BUILD_TESTS=OFF -DDMPCHECK_WITH_PYTHON=OFF -DDMPCHECK_USE_PCH=OFF >/dev/null
cmake --build build-fuzz --target "${targets[@]/%/_fuzz}"
status=0
for target in "${targets[@]}"; do
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
