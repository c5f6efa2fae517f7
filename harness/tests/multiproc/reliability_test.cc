// The harness under stress from outside: Ctrl-C, two runs at once, torchrun's error file, and
// ranks started by srun's variables.
#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "multiproc/multiproc_util.h"

namespace dmpcheck {
namespace {

// Processes whose environment carries `tag` (the launcher hands its environment to the ranks).
int processes_tagged(const std::string& tag) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos || name == std::to_string(::getpid())) continue;
    std::ifstream in(entry.path() / "environ", std::ios::binary);
    const std::string env((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (env.find(tag) != std::string::npos) ++count;
  }
  return count;
}

pid_t spawn(const std::vector<std::string>& args, const std::vector<std::string>& env_extra, const std::string& log) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (const auto& e : env_extra) ::putenv(const_cast<char*>(e.c_str()));
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

int wait_for(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

const char* kHang = R"(version: 1
name: hang
world_size: 2
steps: 2
batch_size: 4
timeout_s: 60
tables:
  - {name: t, rows: 16, dim: 4, features: [f], sharding: {types: [table_wise]}}
faults:
  - {kind: hang, rank: 1, step: 1}
)";

class Reliability : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::temporary_directory(); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  std::string dir_;
};

TEST_F(Reliability, CtrlCStopsEveryRankAndLeavesNothingBehind) {
  const std::string tag = "DMPCHECK_TEST_TAG=ctrl-c-" + std::to_string(::getpid());
  const pid_t pid = spawn({DMPCHECK_CLI_PATH, "run", write("hang.yaml", kHang), "--out", dir_ + "/reports"}, {tag},
                          dir_ + "/run.log");
  // Wait until the ranks are up and one of them hangs.
  for (int i = 0; i < 100 && testing::read_file(dir_ + "/run.log").find("injecting fault 'hang'") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(processes_tagged(tag), 3);  // dmpcheck and its two ranks
  const auto start = std::chrono::steady_clock::now();
  ::kill(pid, SIGINT);
  EXPECT_EQ(wait_for(pid), 130);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
  EXPECT_EQ(processes_tagged(tag), 0);
  // The interrupted run still has its report, written atomically (no temporary left).
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/reports/hang/default.json"));
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir_ + "/reports")) {
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  }
}

TEST_F(Reliability, TwoRunsAtOnceNeverCollide) {
  const std::string seed = DMPCHECK_SOURCE_DIR "/scenarios/regressions/torchrec-1739-dp-tables-not-broadcast.yaml";
  const pid_t a = spawn({DMPCHECK_CLI_PATH, "run", "--quiet", seed, "--out", dir_ + "/a"}, {}, dir_ + "/a.log");
  const pid_t b = spawn({DMPCHECK_CLI_PATH, "run", "--quiet", seed, "--out", dir_ + "/b"}, {}, dir_ + "/b.log");
  EXPECT_EQ(wait_for(a), 0) << testing::read_file(dir_ + "/a.log");
  EXPECT_EQ(wait_for(b), 0) << testing::read_file(dir_ + "/b.log");
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/a/torchrec-1739-dp-tables-not-broadcast/unseeded_current.json"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/b/torchrec-1739-dp-tables-not-broadcast/unseeded_current.json"));
}

TEST_F(Reliability, AFailingRankWritesTorchrunsErrorFile) {
  std::string text = kHang;
  text = testing::replace_once(text, "world_size: 2", "world_size: 1");
  text = testing::replace_once(text, "{kind: hang, rank: 1, step: 1}", "{kind: throw, rank: 0, step: 1}");
  const std::string error_file = dir_ + "/error.json";
  const pid_t pid = spawn({DMPCHECK_CLI_PATH, "worker", write("throw.yaml", text), "--out", dir_ + "/reports"},
                          {"RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(free_port()),
                           "TORCHELASTIC_ERROR_FILE=" + error_file},
                          dir_ + "/worker.log");
  EXPECT_EQ(wait_for(pid), 3) << testing::read_file(dir_ + "/worker.log");
  const auto error = nlohmann::json::parse(testing::read_file(error_file));
  EXPECT_NE(error["message"]["message"].get<std::string>().find("injected fault: rank 0 throws at step 1"), std::string::npos);
  EXPECT_TRUE(error["message"]["extraInfo"].contains("timestamp"));
}

TEST_F(Reliability, RanksStartedWithSrunsVariablesJoin) {
  const std::string seed = DMPCHECK_SOURCE_DIR "/scenarios/regressions/torchrec-1739-dp-tables-not-broadcast.yaml";
  const std::string port = "MASTER_PORT=" + std::to_string(free_port());
  std::vector<pid_t> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(spawn({DMPCHECK_CLI_PATH, "worker", seed, "--out", dir_ + "/reports"},
                          {"SLURM_PROCID=" + std::to_string(r), "SLURM_NTASKS=2", "SLURM_LOCALID=" + std::to_string(r),
                           "SLURM_NTASKS_PER_NODE=2", "MASTER_ADDR=127.0.0.1", port},
                          dir_ + "/rank" + std::to_string(r) + ".log"));
  }
  EXPECT_EQ(wait_for(ranks[0]), 0) << testing::read_file(dir_ + "/rank0.log");
  EXPECT_EQ(wait_for(ranks[1]), 0) << testing::read_file(dir_ + "/rank1.log");
  EXPECT_NE(testing::read_file(dir_ + "/rank0.log").find("PASS (bug reproduced as expected)"), std::string::npos);
}

TEST_F(Reliability, RepeatComparesDigestsAndTimeoutOverridesTheScenario) {
  std::string text = kHang;
  text = testing::replace_once(text, "faults:\n  - {kind: hang, rank: 1, step: 1}\n", "");
  const std::string file = write("plain.yaml", text);
  const pid_t repeat = spawn({DMPCHECK_CLI_PATH, "run", "--quiet", "--repeat", "3", file, "--out", dir_ + "/r"}, {}, dir_ + "/repeat.log");
  EXPECT_EQ(wait_for(repeat), 0) << testing::read_file(dir_ + "/repeat.log");
  EXPECT_NE(testing::read_file(dir_ + "/repeat.log").find("every digest identical over 3 repetitions"), std::string::npos);
  // A hang with the scenario's 60 s deadline, cut to 2 s from the command line.
  const auto start = std::chrono::steady_clock::now();
  const pid_t hang = spawn({DMPCHECK_CLI_PATH, "run", "--quiet", "--timeout", "2", write("hang.yaml", kHang), "--out", dir_ + "/h"}, {},
                           dir_ + "/hang.log");
  EXPECT_EQ(wait_for(hang), 3);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  EXPECT_NE(testing::read_file(dir_ + "/hang.log").find("failed after up to 2000 ms"), std::string::npos)
      << testing::read_file(dir_ + "/hang.log");
}

}  // namespace
}  // namespace dmpcheck
