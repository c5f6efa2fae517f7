#!/usr/bin/python3
"""Fails when the code is not clang-formatted (.clang-format) or clang-tidy finds something
(.clang-tidy) in a translation unit of the library, the CLI or the module, or when the TorchRec
rank program (torchrec_sut/dmpcheck_torchrec) is not strictly typed (mypy, [tool.mypy] in
pyproject.toml).

    /usr/bin/python3 ci/lint.py [--build-dir build] [--no-tidy]
    /usr/bin/python3 ci/lint.py --install-mypy     # what ci/setup.sh runs: the pinned mypy, once

Runs after a build (it reads the build's compile_commands.json; --no-tidy, the format and the
types only, needs none).  First it lints tests/lint/violations.cc, which breaks both rules on
purpose, and fixtures/lint/untyped.py, which has a function without annotations, and stops if a
tool stays silent there: a lint that passes because its configuration was not read proves nothing.
mypy (MYPY_VERSION, from PyPI) lives in a virtual environment of its own under
~/.cache/dmpcheck/mypy-<version>, made on first use; torch, torchrec and fbgemm_gpu are neither
needed nor read (the configuration skips them as untyped).
clang-tidy parses libtorch's headers for every file (about 5 s each), so its verdicts are cached
under ~/.cache/dmpcheck/tidy, keyed by the tool, the configuration, the compile command and the
preprocessed source (this checkout's own path left out): a file is re-checked exactly when
something it sees has changed.
"""
import argparse
import concurrent.futures
import fcntl
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLANG_FORMAT = "clang-format-14"
CLANG_TIDY = "clang-tidy-14"
CLANG = "clang++-14"
VIOLATIONS = ROOT / "tests/lint/violations.cc"
MYPY_VERSION = "1.16.1"  # the last mypy that checks against Python 3.8, the oldest the package runs on
TYPED = "torchrec_sut/dmpcheck_torchrec"
UNTYPED = ROOT / "fixtures/lint/untyped.py"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dmpcheck"


def sources():
    out = subprocess.run(["git", "ls-files", "harness/*.cc", "harness/*.h", "tests/*.cc"], cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout.split()
    return [f for f in out if not f.startswith("tests/lint/")]


# Settings are read once, at main (harness/common/settings.h): nothing else in the library or the
# program reads a DMPCHECK_ variable or sets any.  The exceptions are what a rank is told by its
# launcher (the wire, read once at the rank's start) and the programs that have no main of ours.
SETTINGS_READERS = {"harness/common/settings.cc", "harness/run/worker.cc", "harness/comm/backends.cc",
                    "harness/python/module.cc", "harness/bench/microbench.cc"}
SETTINGS_READ = re.compile(r"\b(setenv|putenv)\s*\(|getenv\s*\(\s*\"DMPCHECK_")


def settings_findings(files):
    found = []
    for f in files:
        if f in SETTINGS_READERS or not f.startswith("harness/") or f.startswith("harness/tests/"):
            continue
        for number, line in enumerate((ROOT / f).read_text().splitlines(), 1):
            if SETTINGS_READ.search(line):
                found.append(f"{f}:{number}: reads or sets the environment beside harness/common/settings.h: "
                             f"{line.strip()}")
    return found


def format_findings(files):
    r = subprocess.run([CLANG_FORMAT, "--dry-run", "--Werror", *files], cwd=ROOT, capture_output=True, text=True)
    return sorted({line.split(":")[0] for line in r.stderr.splitlines() if ": error:" in line}) if r.returncode else []


def clang_arguments(entry):
    """The entry's compile command without GCC's precompiled header (clang cannot read it)."""
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    out, i = [], 1
    while i < len(args):
        a = args[i]
        if a in ("-o", "-MF", "-MT", "-include") and i + 1 < len(args):
            if a == "-include" and not args[i + 1].endswith("cmake_pch.hxx"):
                out += args[i:i + 2]
            i += 2
            continue
        if a in ("-c", "-MD", "-Winvalid-pch") or a == entry["file"]:
            i += 1
            continue
        out.append(a)
        i += 1
    return out


def tidy(entry, cache_dir, config_key):
    """(file, findings text or '', from cache)."""
    args = clang_arguments(entry)
    pre = subprocess.run([CLANG, "-E", "-P", *args, entry["file"]], cwd=entry["directory"], capture_output=True)
    # Paths of this checkout are left out, so that a fresh clone elsewhere hits the same entries.
    here = str(ROOT).encode()
    key = hashlib.sha256(config_key + b"\0".join(x.encode().replace(here, b"<root>") for x in [*args, entry["file"]]) +
                         pre.stdout.replace(here, b"<root>")).hexdigest()
    cached = cache_dir / key if cache_dir and pre.returncode == 0 else None
    if cached and cached.exists():
        return entry["file"], cached.read_text(), True
    r = subprocess.run([CLANG_TIDY, "--quiet", f"--config-file={ROOT / '.clang-tidy'}", entry["file"], "--",
                        *args], cwd=entry["directory"], capture_output=True, text=True)
    findings = "\n".join(line for line in (r.stdout + r.stderr).splitlines()
                         if re.search(r": (error|warning):", line))
    if r.returncode != 0 and not findings:
        findings = f"{entry['file']}: clang-tidy failed ({r.returncode}):\n{r.stderr[-2000:]}"
    if cached:
        cached.write_text(findings)
    return entry["file"], findings, False


def mypy_python():
    """The interpreter of the virtual environment that holds mypy MYPY_VERSION, made (from PyPI)
    when it is missing; several lints at once take turns on a lock, the later ones finding it made."""
    venv = CACHE / f"mypy-{MYPY_VERSION}"
    python = venv / "bin/python"
    ready = venv / "dmpcheck-ready"  # written last: a folder without it is a broken install
    if ready.exists():
        return python
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "mypy.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready.exists():
            print(f"ci/lint.py: installing mypy {MYPY_VERSION} into {venv}", flush=True)
            subprocess.run(["/usr/bin/python3", "-m", "venv", "--clear", str(venv)], check=True)
            r = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                                f"mypy=={MYPY_VERSION}"], capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"ci/lint.py: pip could not install mypy {MYPY_VERSION} into {venv}:\n{r.stdout}{r.stderr}")
            ready.write_text(MYPY_VERSION + "\n")
    return python


def type_findings():
    """mypy over the package and the untyped fixture in one run: (the package's findings, the
    fixture's, the number of the package's files)."""
    files = sorted(str(f.relative_to(ROOT)) for f in (ROOT / TYPED).glob("*.py"))
    fixture = str(UNTYPED.relative_to(ROOT))
    r = subprocess.run([str(mypy_python()), "-m", "mypy", "--config-file", "pyproject.toml",
                        "--cache-dir", str(CACHE / "mypy-cache"), "--no-error-summary",
                        "--no-pretty", "--show-error-codes", *files, fixture],
                       cwd=ROOT, capture_output=True, text=True)
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    if r.returncode not in (0, 1) or (r.returncode == 1 and not any(": error:" in line for line in lines)):
        sys.exit(f"ci/lint.py: mypy failed ({r.returncode}):\n" + "\n".join(lines[-40:]))
    ours = [line for line in lines if not line.startswith(fixture + ":")]
    theirs = [line for line in lines if line.startswith(fixture + ":")]
    return ours, theirs, len(files)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", default=os.environ.get("DMPCHECK_BUILD_DIR", "build"))
    parser.add_argument("--no-tidy", action="store_true", help="check the format and the types only")
    parser.add_argument("--install-mypy", action="store_true",
                        help=f"install mypy {MYPY_VERSION} where the type check finds it, then exit")
    options = parser.parse_args()
    if options.install_mypy:
        print(f"ci/lint.py: mypy {MYPY_VERSION} ready in {mypy_python().parent.parent}")
        return

    # The rules must bite: the deliberate violations are found, or nothing below means anything.
    if not format_findings([str(VIOLATIONS.relative_to(ROOT))]):
        sys.exit(f"ci/lint.py: {CLANG_FORMAT} found nothing in {VIOLATIONS}, which is misformatted on purpose")
    config_key = (subprocess.run([CLANG_TIDY, "--version"], capture_output=True, text=True).stdout +
                  (ROOT / ".clang-tidy").read_text()).encode()
    probe = {"directory": str(ROOT), "file": str(VIOLATIONS), "command": f"c++ -std=c++17 -c {VIOLATIONS}"}
    if not options.no_tidy and not re.search(r"bugprone-use-after-move", tidy(probe, None, config_key)[1]):
        sys.exit(f"ci/lint.py: {CLANG_TIDY} did not find the use after move in {VIOLATIONS}")
    mistyped, fixture_findings, typed = type_findings()
    if not any("[no-untyped-def]" in line for line in fixture_findings):
        sys.exit(f"ci/lint.py: mypy did not find the function without annotations in {UNTYPED}\n" +
                 "\n".join(fixture_findings))

    files = sources()
    misformatted = format_findings(files)
    for f in misformatted:
        print(f"ci/lint.py: {f} is not clang-formatted (fix: {CLANG_FORMAT} -i {f})")
    print(f"ci/lint.py: format: {len(files) - len(misformatted)} of {len(files)} files as .clang-format says")
    if not all(SETTINGS_READ.search(x) for x in ('::setenv("DMPCHECK_X", "1", 1);', 'std::getenv("DMPCHECK_RANKS")')):
        sys.exit("ci/lint.py: the settings rule does not match a setenv or a getenv of DMPCHECK_")
    beside = settings_findings(files)
    for line in beside:
        print(line)
    print(f"ci/lint.py: settings: {len(beside)} place(s) read or set the environment beside common/settings.h")
    for line in mistyped:
        print(line)
    if mistyped:
        print(f"ci/lint.py: types: mypy {MYPY_VERSION} found {sum(': error:' in x for x in mistyped)} error(s) in "
              f"{TYPED} (strict, [tool.mypy] in pyproject.toml)")
    else:
        print(f"ci/lint.py: types: {typed} files strictly typed (mypy {MYPY_VERSION})")
    if options.no_tidy:
        sys.exit(1 if misformatted or mistyped or beside else 0)

    commands = Path(options.build_dir).resolve() / "compile_commands.json"
    if not commands.exists():
        sys.exit(f"ci/lint.py: {commands} is missing: build first (bash ci/build.sh)")
    entries = [e for e in json.loads(commands.read_text())
               if re.search(r"/harness/(?!tests/|fuzz/|bench/microbench)[^ ]*\.cc$", e["file"])]
    cache_dir = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dmpcheck/tidy"
    cache_dir.mkdir(parents=True, exist_ok=True)
    failed, hits = [], 0
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        for file, findings, hit in pool.map(lambda e: tidy(e, cache_dir, config_key), entries):
            hits += hit
            if findings:
                failed.append(file)
                print(findings)
    print(f"ci/lint.py: tidy: {len(entries) - len(failed)} of {len(entries)} translation units clean "
          f"({hits} verdicts from the cache)")
    sys.exit(1 if misformatted or mistyped or beside or failed else 0)


if __name__ == "__main__":
    main()
