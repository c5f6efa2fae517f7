// The launcher on its own, with stand-in rank programs: fail fast, name the rank and its
// cause, and leave no process behind.
#include "run/launcher.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <thread>

#include <unistd.h>

#include <gtest/gtest.h>

#include "common/settings.h"
#include "multiproc/multiproc_util.h"

namespace dmpcheck::run {
namespace {

// The launcher under test starts the ranks; the fixture checks that none is left behind.
class Launcher : public testing::MultiProcessTest {};

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

LaunchRequest shell_ranks(const std::string& script, int world_size) {
  LaunchRequest request;
  request.executable = "/bin/sh";
  request.arguments = {"-c", script};
  request.world_size = world_size;
  request.budget = std::chrono::seconds(30);
  return request;
}

TEST_F(Launcher, ARankThatExitsWithAnErrorStopsTheOthersFastAndIsNamed) {
  // Rank 1 fails after a moment; ranks 0 and 2 would sleep for a day.
  auto request =
      shell_ranks("if [ \"$RANK\" = 1 ]; then echo \"rank $RANK of $WORLD_SIZE at $MASTER_ADDR:$MASTER_PORT\"; "
                  "echo 'boom: table t0 is on fire' >&2; sleep 0.2; exit 7; fi; exec sleep 100000",
                  3);
  // No budget to fall back on: the launch ends only if the launcher stops ranks 0 and 2 itself.
  request.budget = std::chrono::hours(24);
  const LaunchOutcome outcome = launch(request);
  EXPECT_FALSE(outcome.ok);
  ASSERT_TRUE(outcome.failure.has_value());
  EXPECT_EQ(outcome.failure->rank, 1);
  EXPECT_EQ(outcome.failure->cause, "exited with status 7");
  EXPECT_EQ(outcome.failure->message, "boom: table t0 is on fire");
  ASSERT_EQ(outcome.failure->last_lines.size(), 2u);
  EXPECT_TRUE(testing::contains(outcome.failure->last_lines[0], "rank 1 of 3 at 127.0.0.1:"));
  ASSERT_EQ(outcome.pids.size(), 3u);
  for (pid_t pid : outcome.pids) EXPECT_FALSE(alive(pid)) << "pid " << pid << " survived";
}

TEST_F(Launcher, ACrashIsReportedWithItsSignal) {
  const LaunchOutcome outcome = launch(shell_ranks("if [ \"$RANK\" = 0 ]; then kill -SEGV $$; fi; exec sleep 60", 2));
  ASSERT_TRUE(outcome.failure.has_value());
  EXPECT_EQ(outcome.failure->rank, 0);
  EXPECT_EQ(outcome.failure->cause, "killed by signal 11 (SIGSEGV)");
  for (pid_t pid : outcome.pids) EXPECT_FALSE(alive(pid));
}

TEST_F(Launcher, TheBudgetKillsAHungRun) {
  auto request = shell_ranks("exec sleep 100000", 2);  // only the budget ends it
  request.budget = std::chrono::milliseconds(500);
  const LaunchOutcome outcome = launch(request);
  ASSERT_TRUE(outcome.failure.has_value());
  EXPECT_EQ(outcome.failure->kind, dmpcheck::check::FailureKind::kTimeout);
  for (pid_t pid : outcome.pids) EXPECT_FALSE(alive(pid));
}

TEST_F(Launcher, AnEndlessLineIsCutAndDoesNotHoldTheDeadline) {
  // One line of 100 MB, then a hang: the launcher must stop it at the budget, however fast it prints.
  auto request = shell_ranks("head -c 100000000 /dev/zero | tr '\\0' a; echo; exec sleep 100000", 1);
  request.budget = std::chrono::seconds(3);
  size_t longest = 0;
  std::string cut;
  request.on_line = [&](int, const std::string& line) {
    longest = std::max(longest, line.size());
    if (line.find("bytes of this line cut") != std::string::npos) cut = line.substr(line.rfind(" ["));
  };
  const auto start = std::chrono::steady_clock::now();
  const LaunchOutcome outcome = launch(request);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(outcome.failure.has_value());
  EXPECT_EQ(outcome.failure->kind, dmpcheck::check::FailureKind::kTimeout);
  EXPECT_LT(seconds, 3 + 5.0);  // the budget, and the grace to stop the ranks: not the time to read 100 MB
  EXPECT_LT(longest, 17u * 1024);
  // Read whole before the budget (on an idle machine) or not: where it was, its cut is counted.
  if (!cut.empty()) EXPECT_EQ(cut, " [dmpcheck: 99983616 more bytes of this line cut]");
  for (pid_t pid : outcome.pids) EXPECT_FALSE(alive(pid));
}

TEST_F(Launcher, AChildThatLeftTheGroupIsKilledAndCounted) {
  // The rank starts a process in a session of its own (setsid), which the group's kill misses,
  // writes its pid down and exits 0.
  const std::string pid_file = dir_ + "/stray.pid";
  auto request = shell_ranks("setsid sh -c 'echo $$ > " + pid_file + ".tmp; mv " + pid_file + ".tmp " + pid_file +
                                 "; exec sleep 300' < /dev/null > /dev/null 2>&1 & "
                                 "while [ ! -f " +
                                 pid_file + " ]; do sleep 0.05; done; exit 0",
                             1);
  const LaunchOutcome outcome = launch(request);
  EXPECT_TRUE(outcome.ok) << (outcome.failure ? outcome.failure->cause : "");
  FILE* f = std::fopen(pid_file.c_str(), "r");
  ASSERT_NE(f, nullptr);
  int stray = 0;
  ASSERT_EQ(std::fscanf(f, "%d", &stray), 1);
  std::fclose(f);
  ASSERT_EQ(outcome.strays.size(), 1u);
  EXPECT_EQ(outcome.strays[0], "pid " + std::to_string(stray) + " (sleep)");
  EXPECT_FALSE(alive(stray)) << "the setsid grandchild " << stray << " outlived the run";
}

TEST_F(Launcher, APeerThatFailsTooIsLetEndByItselfWithinThePeerGrace) {
  // Every rank fails, rank 1 a second after rank 0 (a script's interpreter unwinding its exception).
  auto request = shell_ranks("if [ \"$RANK\" = 1 ]; then sleep 1; exit 2; fi; exit 1", 2);
  request.peer_grace = std::chrono::seconds(5);
  LaunchOutcome outcome = launch(request);
  ASSERT_EQ(outcome.stopped.size(), 2u);
  EXPECT_FALSE(outcome.stopped[1]) << "rank 1 was stopped instead of ending by itself";
  EXPECT_TRUE(WIFEXITED(outcome.wait_statuses[1]) && WEXITSTATUS(outcome.wait_statuses[1]) == 2);
  // The default grace is short: rank 1 is stopped, and said to be.
  request.peer_grace = std::chrono::milliseconds(200);
  outcome = launch(request);
  EXPECT_TRUE(outcome.stopped[1]);
}

TEST_F(Launcher, CleanRanksAndTheirOutputLines) {
  auto request = shell_ranks("echo hello from $RANK; echo threads $OMP_NUM_THREADS", 2);
  request.threads_per_rank = 1;
  std::vector<std::string> lines;
  request.on_line = [&](int rank, const std::string& line) { lines.push_back(std::to_string(rank) + ":" + line); };
  const LaunchOutcome outcome = launch(request);
  EXPECT_TRUE(outcome.ok);
  EXPECT_FALSE(outcome.failure.has_value());
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"0:hello from 0", "0:threads 1", "1:hello from 1", "1:threads 1"}));
}

// Ranks forked from this (warm, single-threaded) process: they see their own environment, their
// output, crashes and exit codes are reported as an exec-ed rank's are, and the parent is untouched.
LaunchRequest forked_ranks(std::function<int()> body, int world_size) {
  auto request = shell_ranks("echo exec-ed rank $RANK", world_size);
  request.in_process = std::move(body);
  return request;
}

TEST_F(Launcher, ForkedRanksSeeTheirOwnEnvironmentAndOutput) {
  ASSERT_EQ(thread_count(), 1);
  int touched = 0;
  auto request = forked_ranks(
      [&] {
        touched = 1;  // the child's copy; the parent's stays 0
        std::printf("forked rank %s of %s, threads %s\n", std::getenv("RANK"), std::getenv("WORLD_SIZE"),
                    std::getenv("OMP_NUM_THREADS"));
        return 0;
      },
      3);
  std::vector<std::string> lines;
  request.on_line = [&](int rank, const std::string& line) { lines.push_back(std::to_string(rank) + ":" + line); };
  const LaunchOutcome outcome = launch(request);
  EXPECT_TRUE(outcome.ok);
  EXPECT_TRUE(outcome.forked);
  EXPECT_EQ(touched, 0);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"0:forked rank 0 of 3, threads 1", "1:forked rank 1 of 3, threads 1",
                                             "2:forked rank 2 of 3, threads 1"}));
  for (pid_t pid : outcome.pids) EXPECT_FALSE(alive(pid));
}

TEST_F(Launcher, AForkedRankThatCrashesOrThrowsIsReportedAndThePeersAreReaped) {
  auto crash = forked_ranks(
      [] {
        if (std::string(std::getenv("RANK")) == "1") std::raise(SIGSEGV);
        ::pause();
        return 0;
      },
      2);
  const LaunchOutcome crashed = launch(crash);
  ASSERT_TRUE(crashed.failure.has_value());
  EXPECT_EQ(crashed.failure->rank, 1);
  EXPECT_EQ(crashed.failure->cause, "killed by signal 11 (SIGSEGV)");
  for (pid_t pid : crashed.pids) EXPECT_FALSE(alive(pid));

  const LaunchOutcome threw =
      launch(forked_ranks([]() -> int { throw std::runtime_error("the table is on fire"); }, 1));
  ASSERT_TRUE(threw.failure.has_value());
  EXPECT_EQ(threw.failure->cause, "exited with status 3");
  EXPECT_EQ(threw.failure->message, "rank 0: error: the table is on fire");
}

TEST_F(Launcher, RanksAreExecedWhenAThreadExistsOrWhenAsked) {
  std::vector<std::string> lines;
  auto request = forked_ranks([] { return 0; }, 1);
  request.on_line = [&](int, const std::string& line) { lines.push_back(line); };
  {
    // A second thread may hold a lock a forked copy would never see released.
    std::atomic<bool> stop{false};
    std::thread other([&] {
      while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    const LaunchOutcome outcome = launch(request);
    stop = true;
    other.join();
    EXPECT_TRUE(outcome.ok);
    EXPECT_FALSE(outcome.forked);
    EXPECT_EQ(lines, (std::vector<std::string>{"exec-ed rank 0"}));
  }
  lines.clear();
  request.exec_ranks = true;
  const LaunchOutcome asked = launch(request);
  EXPECT_FALSE(asked.forked);
  EXPECT_EQ(lines, (std::vector<std::string>{"exec-ed rank 0"}));
  lines.clear();
  request.exec_ranks = false;
  Settings exec = settings();
  exec.exec_ranks = true;  // DMPCHECK_RANKS=exec
  const LaunchOutcome by_variable = [&] {
    const ScopedSettings scoped(exec);
    return launch(request);
  }();
  EXPECT_FALSE(by_variable.forked);
  EXPECT_EQ(lines, (std::vector<std::string>{"exec-ed rank 0"}));
}

}  // namespace
}  // namespace dmpcheck::run
