#!/usr/bin/env bash
# Installs what dmpcheck builds with, from Debian's packages, and ci/lint.py's mypy (the version it
# pins, from PyPI, into a virtual environment of its own under ~/.cache/dmpcheck).  Idempotent: when
# everything is present it prints two lines and touches nothing.
set -euo pipefail

packages=(
  g++ cmake ninja-build ccache git
  clang-format-14 clang-tidy-14 clang-14    # ci/lint.py: the format and the tidy checks of every build
  libtorch-dev        # libtorch 1.13, CPU, with c10d, ProcessGroupGloo, TCPStore
  libgloo-dev         # the Gloo headers that c10d's ProcessGroupGloo.hpp includes
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libfmt-dev
  libgtest-dev libbenchmark-dev
  pybind11-dev python3-dev python3-pytest   # the module and its tests, for Debian's /usr/bin/python3
  python3-venv                              # the TorchRec release environments (ci/torchrec-env.sh)
  openmpi-bin iproute2                      # the multi-host tests: real mpirun across network namespaces
  slurmctld slurmd slurm-client munge       # ... and real srun/sbatch on a two-node Slurm cluster made there
  libjs-chart.js                            # inlined into the HTML report's plot
  chromium                                  # the HTML report's browser test
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "ci/setup.sh: all ${#packages[@]} build packages present"
else
  echo "ci/setup.sh: installing ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "ci/setup.sh: done"
fi

# ci/lint.py's type check of the TorchRec rank program: one pinned mypy on every machine (Debian's is 1.0).
cd "$(dirname "$0")/.."
/usr/bin/python3 ci/lint.py --install-mypy
