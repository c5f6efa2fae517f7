// TorchRec's repository as dmpcheck reads it for `torchrec@<rev>` systems and `bisect --commits`,
// on a small repository made here with the shape of TorchRec's: release tags on branches cut from
// main, fixes on main between them.  git only, no torch.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include <gtest/gtest.h>

#include "common/settings.h"
#include "release/torchrec_systems.h"
#include "run/subprocess.h"
#include "test_util.h"

namespace dmpcheck::run {
namespace {

namespace fs = std::filesystem;
using dmpcheck::testing::contains;
using dmpcheck::testing::throws_with;

std::string sh(const std::string& script) {
  const Captured c = capture({"sh", "-c", "set -e\n" + script});
  EXPECT_TRUE(c.ok()) << script << "\n" << c.output;
  return c.output;
}

class TorchRecRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/dmpcheck-repo-test-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    root_ = dir;
    repo_ = root_ + "/torchrec";
    // main: c1 c2 c3 c4 fix c6 c7; v0.6.0 on a branch from c1, v0.7.0 from c4, v0.8.0 from c6.
    sh("cd " + root_ +
       " && git init -q -b main torchrec && cd torchrec && mkdir torchrec\n"
       "export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@t GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@t\n"
       "commit() { echo \"$1\" > torchrec/__init__.py; git add -A; git commit -q -m \"$1\"; }\n"
       "release() { git checkout -q -b release/v$1; commit \"release $1\"; git tag v$1; git checkout -q main; }\n"
       "commit c1; release 0.6.0; commit c2; commit c3; commit c4; release 0.7.0\n"
       "commit 'Broadcast DP tables when init'; commit c6; release 0.8.0; commit c7\n");
    Settings here = settings();
    here.torchrec_repo = repo_;
    here.torchrec_envs = root_ + "/cache";
    scoped_.emplace(here);
  }
  // DMPCHECK_TORCHREC_REPO and DMPCHECK_TORCHREC_ENVS, as a test changes them.
  void set_repo(const std::string& repo) {
    Settings changed = settings();
    changed.torchrec_repo = repo;
    install_settings(changed);
  }
  void TearDown() override {
    scoped_.reset();
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  std::string root_, repo_;
  std::optional<ScopedSettings> scoped_;
  const std::vector<std::string> pinned_ = {"0.6.0", "0.7.0", "0.8.0", "1.9.2"};
};

TEST_F(TorchRecRepositoryTest, ACommitRunsOverTheReleaseBeforeTheFirstThatContainsIt) {
  const TorchRecRepository repo = TorchRecRepository::open();
  EXPECT_EQ(repo.path(), repo_);  // a local clone is used in place
  std::string why;
  const Commit fix = repo.resolve("main~1");
  EXPECT_EQ(fix.subject, "c6");
  EXPECT_EQ(repo.base_release(fix, pinned_, &why), "0.7.0");                     // in v0.8.0, not in v0.7.0
  EXPECT_EQ(repo.base_release(repo.resolve("main~4"), pinned_, &why), "0.6.0");  // c3
  // Newer than every tag the repository has: the newest pinned release.
  EXPECT_EQ(repo.base_release(repo.resolve("main"), pinned_, &why), "1.9.2");
  // Already in the oldest pinned release: no environment is older.
  EXPECT_EQ(repo.base_release(repo.resolve("main~6"), pinned_, &why), "");
  EXPECT_TRUE(contains(why, "is already in torchrec 0.6.0, the oldest pinned release"));
  EXPECT_EQ(repo.release_tag("0.7.0"), std::optional<std::string>("v0.7.0"));
  EXPECT_EQ(repo.release_tag("1.9.2"), std::nullopt);
}

TEST_F(TorchRecRepositoryTest, TheCommitsBetweenTwoReleasesAreMainsFromTheBranchPoint) {
  const TorchRecRepository repo = TorchRecRepository::open();
  const std::string fork = repo.merge_base("v0.7.0", "v0.8.0");
  EXPECT_EQ(repo.resolve(fork).subject, "c4");
  const auto commits = repo.first_parent_range(fork, "v0.8.0");
  ASSERT_EQ(commits.size(), 3u);
  EXPECT_EQ(commits[0].subject, "Broadcast DP tables when init");
  EXPECT_EQ(commits[1].subject, "c6");
  EXPECT_EQ(commits[2].subject, "release 0.8.0");
  EXPECT_EQ(commits[0].date.size(), 10u);  // YYYY-MM-DD
  EXPECT_TRUE(repo.is_ancestor(commits[0].hash, "v0.8.0"));
  EXPECT_FALSE(repo.is_ancestor(commits[0].hash, "v0.7.0"));
}

TEST_F(TorchRecRepositoryTest, ACommitsSourceIsExtractedOnceAndAnUnknownRevisionIsNamed) {
  const TorchRecRepository repo = TorchRecRepository::open();
  const Commit fix = repo.resolve("main~2");
  const std::string dir = repo.source_tree(fix);
  EXPECT_EQ(dir, root_ + "/cache/commits/" + fix.hash);
  std::ifstream in(dir + "/torchrec/__init__.py");
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "Broadcast DP tables when init");
  EXPECT_EQ(repo.source_tree(fix), dir);
  EXPECT_TRUE(throws_with(ErrorKind::kInvalidInput,
                          "torchrec@nope: TorchRec's repository " + repo_ + " has no commit 'nope'",
                          [&] { repo.resolve("nope"); }));
  // Through the system: the commit over the release it descends from, whose environment is missing.
  std::string why_not;
  EXPECT_FALSE(resolve_environment(*scenario::System::parse("torchrec@main~2"), why_not).has_value());
  EXPECT_TRUE(contains(why_not, "torchrec@main~2 runs its source over the torchrec 0.7.0 environment, and torchrec "
                                "0.7.0 is not installed"));
}

TEST_F(TorchRecRepositoryTest, ABundleIsClonedOnceIntoTheCacheAndNoRepositoryIsNamed) {
  sh("cd " + repo_ + " && git bundle create -q " + root_ + "/torchrec.bundle --all");
  set_repo(root_ + "/torchrec.bundle");
  const TorchRecRepository repo = TorchRecRepository::open();
  EXPECT_EQ(repo.path().rfind(root_ + "/cache/repos/torchrec-", 0), 0u) << repo.path();
  EXPECT_EQ(repo.resolve("v0.8.0").subject, "release 0.8.0");
  EXPECT_EQ(TorchRecRepository::open().path(), repo.path());
  set_repo("");
  EXPECT_TRUE(
      throws_with(ErrorKind::kInvalidInput, "give --torchrec-repo PATH|URL", [] { TorchRecRepository::open(); }));
  set_repo(root_ + "/nothing-here");
  EXPECT_TRUE(throws_with(ErrorKind::kInvalidInput, "git clone failed", [] { TorchRecRepository::open(); }));
}

// A set of pins has an environment of its own, named as ci/torchrec-env.sh names it, and a missing
// one says the installer's command for that set (one argument, quoted).
TEST_F(TorchRecRepositoryTest, ASetOfPinsHasItsOwnEnvironmentAndItsOwnInstallCommand) {
  const auto skew = scenario::System::parse("torchrec==1.2.0 fbgemm-gpu-cpu==1.1.0");
  ASSERT_TRUE(skew.has_value());
  EXPECT_EQ(environment_dir(*skew), root_ + "/cache/torchrec-1.2.0+fbgemm-gpu-cpu=1.1.0");
  EXPECT_EQ(environment_dir(scenario::System::release("1.2.0")), root_ + "/cache/torchrec-1.2.0");
  std::string why_not;
  EXPECT_FALSE(resolve_environment(*skew, why_not).has_value());
  EXPECT_TRUE(contains(why_not, "torchrec 1.2.0, fbgemm-gpu-cpu 1.1.0 is not installed in " + root_ +
                                    "/cache/torchrec-1.2.0+fbgemm-gpu-cpu=1.1.0: run `bash ci/torchrec-env.sh "
                                    "'torchrec==1.2.0 fbgemm-gpu-cpu==1.1.0'`"))
      << why_not;
}

TEST(Subprocess, CapturesOutputAndStatusAndStopsAtItsDeadline) {
  const Captured ok = capture({"sh", "-c", "echo out; echo err >&2; exit 3"}, {{"DMPCHECK_X", "1"}});
  EXPECT_EQ(ok.exit_code, 3);
  EXPECT_EQ(ok.output, "out\nerr\n");
  EXPECT_EQ(capture({"sh", "-c", "printf %s \"$DMPCHECK_X\""}, {{"DMPCHECK_X", "given"}}).output, "given");
  const Captured slow = capture({"sleep", "30"}, {}, std::chrono::seconds(1));
  EXPECT_TRUE(slow.timed_out);
  EXPECT_FALSE(slow.ok());
  EXPECT_TRUE(throws_with(ErrorKind::kInvalidInput, "cannot start /nonexistent/program",
                          [] { capture({"/nonexistent/program"}); }));
  // How it ended, in words: a signal is named, not "exited -1".
  EXPECT_EQ(capture({"sh", "-c", "kill -9 $$"}).ended(std::chrono::seconds(120)), "was killed by signal 9 (SIGKILL)");
  EXPECT_EQ(slow.ended(std::chrono::seconds(1)), "took longer than 1 s");
  EXPECT_EQ(ok.ended(std::chrono::seconds(1)), "exited 3");
}

TEST(Subprocess, WhatTheProgramStartedEndsWithItAtTheDeadline) {
  // A helper that keeps the output open (as git's transports do) is killed with its program.
  const auto start = std::chrono::steady_clock::now();
  const Captured c = capture({"sh", "-c", "sleep 300 & echo $!; wait"}, {}, std::chrono::seconds(1));
  EXPECT_TRUE(c.timed_out);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  const pid_t helper = static_cast<pid_t>(std::stol(c.output));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::ifstream stat("/proc/" + std::to_string(helper) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  // Gone, or a zombie waiting for whoever adopted it.
  EXPECT_TRUE(text.empty() || text.find(") Z ") != std::string::npos) << text;
}

TEST_F(TorchRecRepositoryTest, ACloneIsBoundedAndAStagingFolderAKilledCommandLeftIsRemoved) {
  // A staging folder of a dmpcheck that no longer runs (pid 0x7fffffff is never one) goes first.
  fs::create_directories(root_ + "/cache/repos/torchrec-abc.git.partial-2147483647/objects");
  sh("cd " + repo_ + " && git bundle create -q " + root_ + "/torchrec.bundle --all");
  set_repo(root_ + "/torchrec.bundle");
  (void)TorchRecRepository::open();
  EXPECT_FALSE(fs::exists(root_ + "/cache/repos/torchrec-abc.git.partial-2147483647"));
}

}  // namespace
}  // namespace dmpcheck::run
