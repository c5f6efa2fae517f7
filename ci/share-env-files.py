"""Shares the files a new TorchRec environment has in common with the ready ones, as hard links.

    python3 ci/share-env-files.py ROOT NEW     # NEW: the folder name under ROOT, e.g. torchrec-1.9.1

Releases that pin the same torch and fbgemm-gpu-cpu (1.9.0, 1.9.1 and 1.9.2; 1.5.0 and 1.5.1) hold
the same libraries byte for byte, and every environment holds the same numpy, sympy, networkx...
A file of NEW whose path under its environment, size, mode and bytes are those of a file in a ready
environment (one with dmpcheck-ready.json) becomes a hard link to it: one copy on disk.  Nothing is
ever written in place afterwards (pip replaces files, Python writes its caches anew, an environment
is removed whole), so a link never changes what another environment reads.  Prints what it saved.
"""

import filecmp
import os
import sys

MIN_SIZE = 4096  # smaller files save little and cost a compare each


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    root, new = sys.argv[1], sys.argv[2]
    new_dir = os.path.join(root, new)
    others = sorted(
        os.path.join(root, d)
        for d in os.listdir(root)
        if d != new and d.startswith("torchrec-") and os.path.isfile(os.path.join(root, d, "dmpcheck-ready.json"))
    )
    shared_files = shared_bytes = 0
    for dirpath, _dirnames, filenames in os.walk(new_dir):
        rel_dir = os.path.relpath(dirpath, new_dir)
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if not os.path.isfile(path) or os.path.islink(path) or st.st_size < MIN_SIZE:
                continue
            for other in others:
                candidate = os.path.join(other, rel_dir, name)
                try:
                    ot = os.lstat(candidate)
                except FileNotFoundError:
                    continue
                if os.path.islink(candidate) or ot.st_size != st.st_size or ot.st_mode != st.st_mode:
                    continue
                if (ot.st_dev, ot.st_ino) == (st.st_dev, st.st_ino):
                    break  # already one file
                if not filecmp.cmp(path, candidate, shallow=False):
                    continue
                tmp = path + ".dmpcheck-link"
                os.link(candidate, tmp)
                os.replace(tmp, path)
                shared_files += 1
                shared_bytes += st.st_size
                break
    print(
        f"ci/share-env-files.py: {new}: {shared_files} files ({shared_bytes / 2**20:.0f} MB) shared with "
        f"{len(others)} other environment(s) as hard links"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
