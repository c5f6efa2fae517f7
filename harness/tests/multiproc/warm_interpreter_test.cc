// Ranks forked from a warm interpreter (warm_interpreter.h), without torch: Debian's Python runs
// the real dmpcheck_torchrec.warm over a stand-in rank module, through the real launcher.  Each
// way a rank ends is reported as an exec-ed rank's is, the interpreter is shared by the launches
// of one process, and nothing outlives the launcher, however it ends.
#include "run/warm_interpreter.h"

#include <chrono>
#include <csignal>
#include <fstream>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "common/settings.h"
#include "multiproc/multiproc_util.h"
#include "run/launcher.h"

namespace dmpcheck::run {
namespace {

// The stand-in rank: `python -m warm_fixture MODE DIR`.
const char* kFixture = R"(import json, os, signal, sys, time
mode, out = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
if mode == "hello":
    print(f"rank {rank} of {os.environ['WORLD_SIZE']} omp {os.environ['OMP_NUM_THREADS']} parent {os.getppid()} "
          f"main {__name__ == '__main__'} argv {sys.argv[1:]}")
    sys.exit(0)
if mode == "fail" and rank == 1:
    os.makedirs(f"{out}/rank1", exist_ok=True)
    with open(f"{out}/rank1/error.json", "w") as f:
        from dmpcheck_torchrec.contract import SCHEMA_VERSION  # the version the launcher reads
        json.dump({"schema_version": SCHEMA_VERSION, "kind": "torchrec", "message": "table t0 is on fire", "traceback": ""}, f)
    time.sleep(0.2)
    sys.exit(3)
if mode == "crash" and rank == 0:
    os.kill(os.getpid(), signal.SIGSEGV)
if mode == "raise" and rank == 0:
    raise ValueError("boom in the rank")
if mode == "sleep":
    with open(f"{out}/pid{rank}", "w") as f:
        f.write(f"{os.getpid()} {os.getppid()}")
time.sleep(100000)
)";

// A stack that takes a while to import: it says when it began and ended (and in which process),
// and the interpreter tagged `broken` fails to import it.
const char* kSlowStack = R"(import os, time
tag, out = os.environ["WARM_TAG"], os.environ["WARM_OUT"]
open(f"{out}/began-{tag}", "w").write(str(os.getpid()))
time.sleep(float(os.environ.get("WARM_SLEEP", "0.8")))
if tag == "broken":
    raise ImportError("the stack of broken does not import")
open(f"{out}/ended-{tag}", "w").write(str(os.getpid()))
)";

bool gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string p, comm, state;
  return !(stat >> p >> comm >> state) || state == "Z";
}

class WarmRanks : public testing::MultiProcessTest {
 protected:
  void SetUp() override {
    MultiProcessTest::SetUp();
    write("warm_fixture.py", kFixture);
    write("slow_stack.py", kSlowStack);
  }

  // The interpreter tagged `tag` that imports slow_stack, as prestart and get() name it.
  WarmInterpreter::Wanted slow(const std::string& tag) {
    LaunchRequest request = ranks("hello", 1);
    request.environment["WARM_TAG"] = tag;
    request.environment["WARM_OUT"] = dir_;
    return {request.executable, request.environment, {"json", "slow_stack"}, nullptr};
  }

  pid_t began(const std::string& tag) {
    std::ifstream in(path("began-" + tag));
    pid_t pid = -1;
    return in >> pid ? pid : -1;
  }

  LaunchRequest ranks(const std::string& mode, int world_size) {
    LaunchRequest request;
    request.executable = "/usr/bin/python3";
    request.arguments = {"-m", "warm_fixture", mode, dir_};
    request.world_size = world_size;
    request.budget = std::chrono::seconds(60);
    request.error_dir = dir_;
    request.environment = {{"PYTHONPATH", dir_ + ":" + DMPCHECK_SOURCE_DIR "/torchrec_sut"},
                           {"PYTHONDONTWRITEBYTECODE", "1"},
                           {"PYTHONUNBUFFERED", "1"}};
    request.warm_preload = {"json"};
    return request;
  }

  pid_t interpreter_pid(const LaunchRequest& request) {
    std::string why;
    const auto warm = WarmInterpreter::get(request.executable, request.environment, request.warm_preload, why);
    EXPECT_TRUE(warm) << why;
    return warm ? warm->pid() : -1;
  }
};

TEST_F(WarmRanks, RanksAreForksOfOneInterpreterSharedByTheLaunchesOfAProcess) {
  auto request = ranks("hello", 3);
  request.threads_per_rank = 2;
  std::vector<std::string> lines;
  request.on_line = [&](int rank, const std::string& line) { lines.push_back(std::to_string(rank) + ":" + line); };
  const LaunchOutcome first = launch(request);
  ASSERT_TRUE(first.ok) << (first.failure ? first.failure->message : "");
  EXPECT_TRUE(first.warm_interpreter);
  EXPECT_EQ(first.cold_reason, "");
  const pid_t interpreter = interpreter_pid(request);
  std::sort(lines.begin(), lines.end());
  ASSERT_EQ(lines.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(lines[static_cast<size_t>(r)],
              fmt::format("{}:rank {} of 3 omp 2 parent {} main True argv ['hello', '{}']", r, r, interpreter, dir_));
  }
  const LaunchOutcome second = launch(request);  // the same interpreter again: nothing imported twice
  EXPECT_TRUE(second.ok && second.warm_interpreter);
  EXPECT_EQ(interpreter_pid(request), interpreter);
  for (pid_t pid : first.pids) EXPECT_TRUE(gone(pid));
}

TEST_F(WarmRanks, ARankThatFailsIsNamedWithItsOwnReasonAndItsPeersAreStopped) {
  auto request = ranks("fail", 3);
  request.budget = std::chrono::hours(24);  // only the launcher's own stop ends ranks 0 and 2
  const LaunchOutcome outcome = launch(request);
  ASSERT_TRUE(outcome.failure.has_value());
  EXPECT_TRUE(outcome.warm_interpreter);
  EXPECT_EQ(outcome.failure->rank, 1);
  EXPECT_EQ(outcome.failure->cause, "exited with status 3");
  EXPECT_EQ(outcome.failure->message, "table t0 is on fire");
  for (pid_t pid : outcome.pids) EXPECT_TRUE(gone(pid)) << pid;
}

TEST_F(WarmRanks, ACrashAndAnUncaughtExceptionAreReportedAsAnExecedRanksAre) {
  const LaunchOutcome crash = launch(ranks("crash", 2));
  ASSERT_TRUE(crash.failure.has_value());
  EXPECT_EQ(crash.failure->rank, 0);
  EXPECT_EQ(crash.failure->cause, "killed by signal 11 (SIGSEGV)");
  const LaunchOutcome raised = launch(ranks("raise", 2));
  ASSERT_TRUE(raised.failure.has_value());
  EXPECT_EQ(raised.failure->rank, 0);
  EXPECT_EQ(raised.failure->cause, "exited with status 1");  // as `python -m` exits on an exception
  EXPECT_EQ(raised.failure->message, "ValueError: boom in the rank");
  for (pid_t pid : crash.pids) EXPECT_TRUE(gone(pid));
  for (pid_t pid : raised.pids) EXPECT_TRUE(gone(pid));
}

TEST_F(WarmRanks, ExecedRanksWhenAskedForOrWhenTheInterpreterCannotImportItsStack) {
  auto asked = ranks("hello", 2);
  asked.exec_ranks = true;
  const LaunchOutcome exec_ed = launch(asked);
  EXPECT_TRUE(exec_ed.ok);
  EXPECT_FALSE(exec_ed.warm_interpreter);
  EXPECT_TRUE(testing::contains(exec_ed.cold_reason, "exec-ed ranks were asked for")) << exec_ed.cold_reason;

  Settings none = settings();
  none.warm_interpreters = 0;  // turned off: cold, and nothing started ahead
  const LaunchOutcome off = [&] {
    const ScopedSettings scoped(none);
    WarmInterpreter::prestart({{"/usr/bin/python3", {}, {"json"}, nullptr}});
    return launch(ranks("hello", 2));
  }();
  EXPECT_TRUE(off.ok);
  EXPECT_FALSE(off.warm_interpreter);
  EXPECT_TRUE(testing::contains(off.cold_reason, "turned off (DMPCHECK_WARM_INTERPRETERS=0)")) << off.cold_reason;

  auto broken = ranks("hello", 2);
  broken.warm_preload = {"json", "no_such_module_of_dmpcheck"};
  const LaunchOutcome cold = launch(broken);
  EXPECT_TRUE(cold.ok) << (cold.failure ? cold.failure->message : "");
  EXPECT_FALSE(cold.warm_interpreter);
  EXPECT_TRUE(testing::contains(cold.cold_reason, "import no_such_module_of_dmpcheck failed: ModuleNotFoundError"))
      << cold.cold_reason;
  EXPECT_TRUE(testing::contains(cold.cold_reason, "ranks start cold")) << cold.cold_reason;
}

// A suite's releases start ahead of their cells: two import at a time (the third waits for one of
// them to be ready), and the interpreter a launch then gets is the one started ahead, not a
// second.  One that cannot import its stack is remembered as such: ranks start cold, once.
TEST_F(WarmRanks, PrestartedInterpretersImportTwoAtATimeAndAreTheOnesLaunchesGet) {
  Settings two = settings();
  two.warm_prestart = 2;
  const ScopedSettings scoped(two);
  WarmInterpreter::prestart({slow("a"), slow("broken"), slow("c")});
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_GT(began("a"), 0);
  EXPECT_GT(began("broken"), 0);
  EXPECT_EQ(began("c"), -1) << "a third import began while two were importing";
  WarmInterpreter::prestart({slow("a")});  // already started: not queued again

  const auto a = slow("a");
  std::string why;
  const auto got = WarmInterpreter::get(a.python, a.environment, a.preload, why);
  ASSERT_TRUE(got) << why;
  EXPECT_EQ(got->pid(), began("a"));
  EXPECT_GT(got->import_seconds(), 0.7);
  for (int i = 0; i < 100 && began("c") == -1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    WarmInterpreter::pump();
  }
  EXPECT_GT(began("c"), 0) << "the queued import never began";

  const auto broken = slow("broken");
  EXPECT_FALSE(WarmInterpreter::get(broken.python, broken.environment, broken.preload, why));
  EXPECT_TRUE(testing::contains(why, "the stack of broken does not import")) << why;
  EXPECT_TRUE(testing::contains(why, "ranks start cold")) << why;
  const pid_t first_try = began("broken");
  EXPECT_FALSE(WarmInterpreter::get(broken.python, broken.environment, broken.preload, why));
  EXPECT_EQ(began("broken"), first_try) << "a failed interpreter was started again";

  const auto c = slow("c");
  const auto third = WarmInterpreter::get(c.python, c.environment, c.preload, why);
  ASSERT_TRUE(third) << why;
  EXPECT_EQ(third->pid(), began("c"));
}

// A command that ends (or is interrupted) while an interpreter it started ahead is still importing
// does not wait for that import: the interpreter is stopped, and nothing is left behind.
TEST_F(WarmRanks, AnInterpreterStillImportingIsStoppedNotWaitedForWhenTheCommandEnds) {
  auto long_import = slow("long");
  long_import.environment["WARM_SLEEP"] = "600";
  WarmInterpreter::prestart({long_import});
  for (int i = 0; i < 100 && began("long") == -1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const pid_t pid = began("long");
  ASSERT_GT(pid, 0);
  const auto start = std::chrono::steady_clock::now();
  WarmInterpreter::stop_all();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4)) << "the import was waited for";
  EXPECT_TRUE(gone(pid));
}

// The launcher is killed outright (no destructor, no handler runs): its socket closes, and the
// interpreter takes its ranks with it.
TEST_F(WarmRanks, NothingOutlivesALauncherKilledWithSigkill) {
  const pid_t launcher = ::fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    auto request = ranks("sleep", 2);
    request.budget = std::chrono::hours(24);
    launch(request);
    ::_exit(0);
  }
  std::vector<pid_t> pids;
  for (int i = 0; i < 300 && pids.size() < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    pids.clear();
    for (int r = 0; r < 2; ++r) {
      std::ifstream in(path("pid" + std::to_string(r)));
      pid_t rank = 0, parent = 0;
      if (in >> rank >> parent) pids.insert(pids.end(), {rank, parent});
    }
  }
  ASSERT_EQ(pids.size(), 4u) << "the ranks did not start";
  EXPECT_EQ(pids[1], pids[3]);  // both forked from one interpreter
  EXPECT_NE(pids[1], launcher);
  ::kill(launcher, SIGKILL);
  ::waitpid(launcher, nullptr, 0);
  bool all_gone = false;
  for (int i = 0; i < 100 && !all_gone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    all_gone = std::all_of(pids.begin(), pids.end(), gone);
  }
  for (pid_t pid : pids) EXPECT_TRUE(gone(pid)) << "pid " << pid << " outlived its launcher";
}

}  // namespace
}  // namespace dmpcheck::run
