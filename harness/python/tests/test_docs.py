"""docs/scenarios.md lists every key the scenario loader accepts: the keys are read from the
loader's own source (kMatrixRoots, kTopLevelKeys and every check_keys list), so a key added there without a
line in the docs fails here."""
import glob
import os
import re

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def loader_keys():
    src = "".join(open(f).read() for f in sorted(glob.glob(os.path.join(ROOT, "harness", "scenario", "*.cc"))))
    keys = set()
    for m in re.finditer(r"check_keys\([^{;]*\{([^}]*)\}", src, re.S):
        keys |= set(re.findall(r'"([a-z_0-9]+)"', m.group(1)))
    # The top level: the run fields (kMatrixRoots) and what kTopLevelKeys adds to them.
    for pattern in (r"kMatrixRoots = \{([^}]*)\}", r"kTopLevelKeys = \[\] \{(.*?)\n\}\(\);"):
        keys |= set(re.findall(r'"([a-z_0-9]+)"', re.search(pattern, src, re.S).group(1)))
    return keys


def test_the_loader_keys_are_found_in_its_source():
    keys = loader_keys()
    assert {"version", "tables", "faults", "fingerprint", "system", "releases", "reference"} <= keys, sorted(keys)


def test_docs_name_every_key_the_loader_accepts():
    doc = open(os.path.join(ROOT, "docs", "scenarios.md")).read()
    missing = sorted(k for k in loader_keys() if not re.search(r"`%s`|`%s:|\b%s:" % (k, k, k), doc))
    assert missing == [], "docs/scenarios.md does not name: %s" % ", ".join(missing)
