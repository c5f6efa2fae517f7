#!/usr/bin/env bash
# The build dependencies ci/device.sh needs on the GPU machine that may be lent (docs/gpu.md):
# it has torch, CMake, ninja and a compiler but no package registry, so the files of the Debian
# packages dmpcheck builds with and that machine lacks (yaml-cpp, nlohmann-json, CLI11, fmt,
# GoogleTest) are copied here from this machine's installed packages into build-device-deps/
# (ignored by git; about 6 MB, for the device tool's `carry`, which allows 64 MiB).
#   bash ci/device-deps.sh [DEST]
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-build-device-deps}
packages=(libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev libcli11-dev libfmt-dev libfmt9 libgtest-dev libgmock-dev)
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    { echo "ci/device-deps.sh: $p is not installed (bash ci/setup.sh installs it)"; exit 1; }
done
tmp=$dest.partial
rm -rf "$tmp"
mkdir -p "$tmp"
list=$tmp/FILES
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Package} ${Version} ${Architecture}\n' "$p" >> "$tmp/PACKAGES"
  # Files and links only (directories come with them), without documentation.
  dpkg -L "$p" | grep -v -e '^/usr/share/doc' -e '^/usr/share/man' | while read -r f; do
    if [[ -L $f || ( -f $f && ! -d $f ) ]]; then echo "${f#/}"; fi
  done >> "$list"
done
tar -C / -cf - -T "$list" | tar -C "$tmp" -xf -
rm -rf "$dest"
mv "$tmp" "$dest"
echo "ci/device-deps.sh: $(wc -l < "$dest/FILES") files of ${#packages[@]} packages in $dest ($(du -sh "$dest" | cut -f1))"
