"""What dmpcheck costs against what it replaces, measured side by side in one run.

Three comparisons, each timed as whole processes, in interleaved pairs (the order alternates from
pair to pair so that neither side always runs on a warmer machine), reported as medians and as the
ratio of the medians:

  1. the seed cell (TorchRec #1739, unseeded, profile torchrec-0.6) under `dmpcheck run`, ranks
     forked from the warm launcher, against the reporter's own script (debug_dp_shard.py) under
     torchrun on a real torchrec 0.6.0 environment;
  2. the same cell with a fresh `dmpcheck worker` exec-ed per rank (the path before warm ranks);
  3. the regression suite's reference cells (`dmpcheck suite scenarios/regressions`, release
     cells filtered out: they time TorchRec's own start-up), forked against exec-ed ranks.

Every timed process must also do its job: the cell and the suites must exit 0, the reporter's
script must print its four "False" lines (the bug, on 0.6.0). A run that does not is an error,
not a number.

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
    parser.add_argument("--json", help="write the timings and ratios here")
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

    def suite(mode):
        return timed([args.dmpcheck, "suite", os.path.join(ROOT, "scenarios", "regressions"), "--filter", SUITE_FILTER,
                      "--ranks", mode, "--out", os.path.join(scratch, "suite")], env)

    results = {}
    try:
        comparisons = [
            ("seed cell: reporter's script on torchrec 0.6.0 / dmpcheck, forked ranks", reporter, lambda: cell("fork"), 10.0),
            ("seed cell: dmpcheck with exec-ed ranks / forked ranks", lambda: cell("exec"), lambda: cell("fork"), None),
            ("regression suite (reference cells): exec-ed ranks / forked ranks", lambda: suite("exec"), lambda: suite("fork"), 3.0),
        ]
        print("%-72s %10s %10s %8s %8s" % ("comparison (slow side / fast side)", "slow (s)", "fast (s)", "ratio", "target"))
        for name, slow, fast, target in comparisons:
            slow_t, fast_t = [], []
            for i in range(args.pairs):
                if i % 2 == 0:
                    slow_t.append(slow())
                    fast_t.append(fast())
                else:
                    fast_t.append(fast())
                    slow_t.append(slow())
            ratio = statistics.median(slow_t) / statistics.median(fast_t)
            met = "" if target is None else (">= %.0fx %s" % (target, "met" if ratio >= target else "NOT met"))
            print("%-72s %10.3f %10.3f %7.1fx %s" % (name, statistics.median(slow_t), statistics.median(fast_t), ratio, met),
                  flush=True)
            results[name] = {"slow_s": slow_t, "fast_s": fast_t, "ratio_of_medians": ratio, "target": target}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print("(medians of %d interleaved pairs; every timed process checked to have done its job)" % args.pairs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
