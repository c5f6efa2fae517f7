"""What dmpcheck costs against what it replaces, measured side by side in one run.

Comparisons, each timed as whole processes, in interleaved pairs (the order alternates from pair
to pair so that neither side always runs on a warmer machine), reported as medians and as the
ratio of the medians:

  1. the seed cell (TorchRec #1739, unseeded, profile torchrec-0.6) under `dmpcheck run`, ranks
     forked from the warm launcher, against the reporter's own script (debug_dp_shard.py) under
     torchrun on a real torchrec 0.6.0 environment;
  2. the same cell with a fresh `dmpcheck worker` exec-ed per rank (the path before warm ranks);
  3. the regression suite's reference cells (`dmpcheck suite scenarios/regressions`, release
     cells filtered out), forked against exec-ed ranks;
  4. a release cell (the seed, unseeded, on real torchrec 0.6.0) run 5 times in one command
     (`--repeat 5`): ranks forked from the release's warm interpreter against fresh interpreters
     (`--ranks exec`), per cell;
  5. the seed's bisection over 0.6.0, 0.7.0, 0.8.0 and 1.9.2, warm against cold (skipped unless
     the four environments are installed);
  6. the whole regression suite, release cells included, warm against cold (--suite-pairs pairs,
     1 by default: the cold side takes minutes);
  7. the regression suite issue 28 timed (87 cells in 118 s: scenarios/regressions at commit
     29ab4d6, taken from this clone's history), with release ranks in fresh interpreters as then
     (DMPCHECK_WARM_INTERPRETERS=0; reference ranks forked, as then) against warm interpreters
     started ahead (--suite-pairs pairs; skipped where the clone has no history);
  8. the reporter's script as a script cell on 0.6.0 (two ranks, as torchrun starts them), with
     dmpcheck's audit against the same cell with `script.audit: false`: what the audit costs;
  9. that audited script cell against the script under torchrun alone: what dmpcheck adds to a
     user's own script.

Every timed process must also do its job: the cells and the suites must exit 0 (a repeat with
identical digests), the bisection must name 0.8.0, the reporter's script must print its four
"False" lines (the bug, on 0.6.0). A run that does not is an error, not a number.

Standard library only; run with any Python 3 (ci/bench.sh uses Debian's /usr/bin/python3).
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = os.path.join(ROOT, "scenarios", "regressions", "torchrec-1739-dp-tables-not-broadcast.yaml")
REPORTER = os.path.join(ROOT, "benchmarks", "reporter-1739", "debug_dp_shard.py")
CELL_FILTER = r"\[init\.mode=unseeded profile=torchrec-0\.6\]"
# Reference cells only: a release cell's run name carries "torchrec==".
SUITE_FILTER = r"^(?!.*torchrec==)"
RELEASE_CELL_FILTER = r"\[init\.mode=unseeded system=torchrec==0\.6\.0\]"
BISECT_RELEASES = ["0.6.0", "0.7.0", "0.8.0", "1.9.2"]
# The regression suite as it was when issue 28 measured it (87 cells, 118 s).
ISSUE28_SUITE_COMMIT = "29ab4d6"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(args, env=None, check=None):
    start = time.perf_counter()
    p = subprocess.run(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.perf_counter() - start
    if p.returncode != 0 or (check is not None and not check(p.stdout)):
        sys.exit("vs_torchrec: this run did not do its job (exit %d): %s\n%s" % (p.returncode, " ".join(args), p.stdout[-3000:]))
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dmpcheck", default=os.path.join(ROOT, "build", "harness", "dmpcheck"))
    parser.add_argument("--envs", default=os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                                                       "dmpcheck", "torchrec"),
                        help="where ci/torchrec-env.sh put the release environments")
    parser.add_argument("--pairs", type=int, default=5, help="timed pairs per comparison (default 5)")
    parser.add_argument("--suite-pairs", type=int, default=1,
                        help="pairs for the whole regression suite, warm against cold (default 1; 0 skips it)")
    parser.add_argument("--json", help="write the timings and ratios here")
    parser.add_argument("--only", help="run only the comparisons whose name contains this text (e.g. \"reporter's "
                                       "script\" for the seed cell against the reporter's script)")
    args = parser.parse_args()

    torchrun = os.path.join(args.envs, "torchrec-0.6.0", "bin", "torchrun")
    if not os.path.exists(torchrun):
        sys.exit("vs_torchrec: no torchrec 0.6.0 environment at %s (bash ci/torchrec-env.sh 0.6.0)" % os.path.dirname(torchrun))
    scratch = tempfile.mkdtemp(prefix="dmpcheck-vs-torchrec-")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("DMPCHECK_RANKS", None)

    def cell(mode):
        return timed([args.dmpcheck, "run", SEED, "--filter", CELL_FILTER, "--quiet", "--ranks", mode,
                      "--out", os.path.join(scratch, "cell")], env,
                     check=lambda out: "1 of 1 run(s) met their expectations" in out)

    def reporter():
        return timed([torchrun, "--nproc-per-node=2", "--master-addr=127.0.0.1", "--master-port=%d" % free_port(),
                      REPORTER], env, check=lambda out: out.count(" False") == 4)

    def suite(mode, filter_=SUITE_FILTER):
        args_ = [args.dmpcheck, "suite", os.path.join(ROOT, "scenarios", "regressions"), "--ranks", mode,
                 "--out", os.path.join(scratch, "suite")]
        if filter_:
            args_ += ["--filter", filter_]
        return timed(args_, dict(env, DMPCHECK_RANKS=mode))

    repeats = 5

    def release_cell(mode):
        # DMPCHECK_RANKS reaches the release's ranks too: exec means fresh interpreters.
        return timed([args.dmpcheck, "run", SEED, "--filter", RELEASE_CELL_FILTER, "--quiet", "--ranks", mode,
                      "--repeat", str(repeats), "--out", os.path.join(scratch, "release")], dict(env, DMPCHECK_RANKS=mode),
                     check=lambda out: "every digest identical over %d repetitions" % repeats in out) / repeats

    def bisect(mode):
        return timed([args.dmpcheck, "bisect", SEED, "--releases", ",".join(BISECT_RELEASES)], dict(env, DMPCHECK_RANKS=mode),
                     check=lambda out: "first release that behaves differently: 0.8.0" in out)

    def script_cell(audit):
        path = os.path.join(scratch, "script-%s.yaml" % ("audited" if audit else "plain"))
        with open(path, "w") as f:
            f.write("version: 1\nname: script-%s\nscript: {path: %s, audit: %s}\nworld_size: 2\n"
                    "system: torchrec==0.6.0\nexpect:\n  - replicas: %s\n%s"
                    % ("audited" if audit else "plain", REPORTER, "true" if audit else "false",
                       "diverge" if audit else "equal",
                       "    diverged: [large_table_0, large_table_1, small_table_0, small_table_1]\n" if audit else ""))
        return timed([args.dmpcheck, "run", path, "--quiet", "--out", os.path.join(scratch, "script")], env,
                     check=lambda out: "1 of 1 run(s) met their expectations" in out)

    def issue28_suite(warm):
        run_env = dict(env)
        if not warm:
            run_env["DMPCHECK_WARM_INTERPRETERS"] = "0"
        return timed([args.dmpcheck, "suite", issue28_dir, "--out", os.path.join(scratch, "suite28")], run_env,
                     check=lambda out: "87 run(s) met their expectations" in out or
                     "86 of 86 run(s) met their expectations, 1 skipped" in out)

    issue28_dir = os.path.join(scratch, "issue28")
    os.makedirs(issue28_dir)
    archive = subprocess.run("git -C %s archive %s scenarios/regressions | tar -x -C %s"
                             % (ROOT, ISSUE28_SUITE_COMMIT, issue28_dir), shell=True, stderr=subprocess.PIPE, text=True)
    issue28_dir = os.path.join(issue28_dir, "scenarios", "regressions")

    installed = all(os.path.exists(os.path.join(args.envs, "torchrec-" + v, "dmpcheck-ready.json"))
                    for v in BISECT_RELEASES)
    results = {}
    try:
        comparisons = [
            ("seed cell: reporter's script on torchrec 0.6.0 / dmpcheck, forked ranks", reporter, lambda: cell("fork"), 20.0,
             args.pairs),
            ("seed cell: dmpcheck with exec-ed ranks / forked ranks", lambda: cell("exec"), lambda: cell("fork"), None,
             args.pairs),
            ("regression suite (reference cells): exec-ed ranks / forked ranks", lambda: suite("exec"), lambda: suite("fork"),
             3.0, args.pairs),
            ("release cell (0.6.0, per cell of --repeat %d): cold / warm interpreter" % repeats, lambda: release_cell("exec"),
             lambda: release_cell("fork"), 3.0, args.pairs),
        ]
        comparisons.append(("reporter's script cell on 0.6.0: audited / script.audit: false",
                            lambda: script_cell(True), lambda: script_cell(False), None, args.pairs))
        comparisons.append(("reporter's script on 0.6.0: audited script cell / torchrun alone",
                            lambda: script_cell(True), reporter, None, args.pairs))
        if installed:
            comparisons.append(("seed bisect over %s: cold / warm" % ",".join(BISECT_RELEASES), lambda: bisect("exec"),
                                lambda: bisect("fork"), None, args.pairs))
        else:
            print("seed bisect: skipped, it needs torchrec %s installed (bash ci/torchrec-env.sh %s)"
                  % (", ".join(BISECT_RELEASES), " ".join(BISECT_RELEASES)))
        if args.suite_pairs > 0:
            comparisons.append(("regression suite (every cell): cold / warm", lambda: suite("exec", None),
                                lambda: suite("fork", None), 2.5, args.suite_pairs))
        if args.suite_pairs > 0 and archive.returncode == 0:
            comparisons.append(("issue 28's suite (87 cells at %s): release ranks cold / warm" % ISSUE28_SUITE_COMMIT,
                                lambda: issue28_suite(False), lambda: issue28_suite(True), 2.5, args.suite_pairs))
        elif args.suite_pairs > 0:
            print("issue 28's suite: skipped, this clone cannot give scenarios/regressions at %s: %s"
                  % (ISSUE28_SUITE_COMMIT, archive.stderr.strip()))
        if args.only:
            comparisons = [c for c in comparisons if args.only in c[0]]
            if not comparisons:
                sys.exit("vs_torchrec: no comparison's name contains %r" % args.only)
        print("%-72s %10s %10s %8s %8s" % ("comparison (slow side / fast side)", "slow (s)", "fast (s)", "ratio", "target"))
        for name, slow, fast, target, pairs in comparisons:
            slow_t, fast_t = [], []
            for i in range(pairs):
                if i % 2 == 0:
                    slow_t.append(slow())
                    fast_t.append(fast())
                else:
                    fast_t.append(fast())
                    slow_t.append(slow())
            ratio = statistics.median(slow_t) / statistics.median(fast_t)
            met = "" if target is None else (">= %gx %s" % (target, "met" if ratio >= target else "NOT met"))
            print("%-72s %10.3f %10.3f %7.1fx %s" % (name, statistics.median(slow_t), statistics.median(fast_t), ratio, met),
                  flush=True)
            results[name] = {"slow_s": slow_t, "fast_s": fast_t, "ratio_of_medians": ratio, "target": target,
                             "pairs": pairs}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print("(medians of %d interleaved pairs, %d for the whole suite; every timed process checked to have done its job)"
          % (args.pairs, args.suite_pairs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
