// The harness under stress from outside: Ctrl-C, two runs at once, torchrun's error file, and
// ranks started by srun's variables.
#include <csignal>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "comm/store.h"
#include "common/error.h"
#include "multiproc/multiproc_util.h"
#include "run/handover.h"

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

class Reliability : public testing::MultiProcessTest {};

TEST_F(Reliability, CtrlCStopsEveryRankAndLeavesNothingBehind) {
  const std::string tag = "DMPCHECK_TEST_TAG=ctrl-c-" + std::to_string(::getpid());
  const size_t run =
      start("run", {DMPCHECK_CLI_PATH, "run", write("hang.yaml", kHang), "--out", path("reports")}, {tag});
  // Wait until the ranks are up and one of them hangs.
  for (int i = 0; i < 100 && testing::read_file(dir_ + "/run.log").find("injecting fault 'hang'") == std::string::npos;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(processes_tagged(tag), 3);  // dmpcheck and its two ranks
  ::kill(pid(run), SIGINT);
  EXPECT_EQ(wait(run), 130);
  EXPECT_EQ(processes_tagged(tag), 0);
  // The interrupted run still has its report, written atomically (no temporary left).
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/reports/hang/default.json"));
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir_ + "/reports")) {
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  }
}

TEST_F(Reliability, TwoRunsAtOnceNeverCollide) {
  const std::string seed = DMPCHECK_SOURCE_DIR "/scenarios/regressions/torchrec-1739-dp-tables-not-broadcast.yaml";
  const size_t a = start("a", {DMPCHECK_CLI_PATH, "run", "--quiet", seed, "--out", dir_ + "/a"}, {});
  const size_t b = start("b", {DMPCHECK_CLI_PATH, "run", "--quiet", seed, "--out", dir_ + "/b"}, {});
  EXPECT_EQ(wait(a), 0) << testing::read_file(dir_ + "/a.log");
  EXPECT_EQ(wait(b), 0) << testing::read_file(dir_ + "/b.log");
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/a/torchrec-1739-dp-tables-not-broadcast/unseeded_torchrec-1.9.json"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/b/torchrec-1739-dp-tables-not-broadcast/unseeded_torchrec-1.9.json"));
  // --quiet: a verdict line per run, no table (a table starts "== <scenario> [<run>]").
  const std::string quiet = testing::read_file(dir_ + "/a.log");
  EXPECT_TRUE(testing::contains(quiet, "VERDICT"));
  EXPECT_FALSE(testing::contains(quiet, "== torchrec-1739")) << quiet;
}

TEST_F(Reliability, AFailingRankWritesTorchrunsErrorFile) {
  std::string text = kHang;
  text = testing::replace_once(text, "world_size: 2", "world_size: 1");
  text = testing::replace_once(text, "{kind: hang, rank: 1, step: 1}", "{kind: throw, rank: 0, step: 1}");
  const std::string error_file = dir_ + "/error.json";
  const size_t worker =
      start("worker", {DMPCHECK_CLI_PATH, "worker", write("throw.yaml", text), "--out", dir_ + "/reports"},
            {"RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(free_port()),
             "TORCHELASTIC_ERROR_FILE=" + error_file});
  EXPECT_EQ(wait(worker), 3) << log(worker);
  const auto error = nlohmann::json::parse(testing::read_file(error_file));
  EXPECT_TRUE(
      testing::contains(error["message"]["message"].get<std::string>(), "injected fault: rank 0 throws at step 1"));
  EXPECT_TRUE(error["message"]["extraInfo"].contains("timestamp"));
}

TEST_F(Reliability, AProcessWithoutTheSecretIsRefusedAndTheRunGoesOn) {
  // Long enough (a few seconds) for the intruder to be on the store while the run goes on.
  const std::string seed =
      write("secret-run.yaml", "version: 1\nname: secret-run\nworld_size: 2\nsteps: 1500\nbatch_size: 4\ntables:\n"
                               "  - {name: t0, rows: 16, dim: 4, features: [f0], sharding: {types: [data_parallel]}}\n"
                               "  - {name: t1, rows: 16, dim: 4, features: [f1], sharding: {types: [table_wise]}}\n");
  const int port = free_port();
  std::vector<size_t> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(
        start("rank" + std::to_string(r), {DMPCHECK_CLI_PATH, "worker", seed, "--out", dir_ + "/reports"},
              {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=2",
               "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port), "DMPCHECK_RUN_SECRET=the-run-secret"}));
  }
  // Rank 0's store is up once rank 1 has been let in; the right secret is the control.
  std::optional<comm::Store> right;
  for (int i = 0; i < 400 && !right; ++i) {
    try {
      right.emplace(
          comm::Store::connect("127.0.0.1", static_cast<uint16_t>(port), "the-run-secret", std::chrono::seconds(2)));
    } catch (const Error&) { std::this_thread::sleep_for(std::chrono::milliseconds(25)); }
  }
  ASSERT_TRUE(right.has_value()) << testing::read_file(dir_ + "/rank0.log");
  // An intruder who guessed a secret gets nothing: no key to read, none to write.
  EXPECT_TRUE(testing::throws_with(ErrorKind::kCommunication, "refused this rank", [&] {
    comm::Store::connect("127.0.0.1", static_cast<uint16_t>(port), "a-guessed-secret", std::chrono::seconds(5));
  }));
  // One that speaks nothing at all is dropped once it has said nothing useful.
  const int raw = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(raw, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string junk(200, 'x');
  (void)!::write(raw, junk.data(), junk.size());
  char buf[256];
  ssize_t got = 0;
  while ((got = ::read(raw, buf, sizeof buf)) > 0) {}
  EXPECT_EQ(got, 0) << "the store kept a connection that did not prove the secret";
  ::close(raw);
  // Every address of this host but loopback: nothing listens there.
  for (const std::string& address : testing::non_loopback_ipv4_addresses()) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in there{};
    there.sin_family = AF_INET;
    there.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, address.c_str(), &there.sin_addr);
    EXPECT_NE(::connect(fd, reinterpret_cast<sockaddr*>(&there), sizeof there), 0)
        << "the store answers on " << address;
    ::close(fd);
  }
  EXPECT_EQ(wait(ranks[0]), 0) << testing::read_file(dir_ + "/rank0.log");
  EXPECT_EQ(wait(ranks[1]), 0) << testing::read_file(dir_ + "/rank1.log");
  const auto report = nlohmann::json::parse(testing::read_file(dir_ + "/reports/secret-run/default.json"));
  EXPECT_EQ(report["verdict"], "pass");
  const std::string log0 = testing::read_file(dir_ + "/rank0.log");
  EXPECT_TRUE(testing::contains(log0, "refused a connection to the run's store from 127.0.0.1:"));
}

TEST(Handover, AnEntryChangedInTheStoreIsRefusedByTheRank) {
  comm::Store host = comm::Store::host("127.0.0.1", "s3cret", std::chrono::seconds(5));
  comm::Store view = run::secret_view(host, "s3cret");
  run::RankTask task;
  task.scenario_text = "version: 1";
  task.run_index = 0;
  run::hand_over(view, task, "s3cret");
  EXPECT_EQ(run::take_task(view, "s3cret").run_index, 0);
  // Someone who learned where the keys are but not the secret rewrites the task.
  task.run_index = 3;
  view.set("entry/task", nlohmann::json(task).dump());
  EXPECT_TRUE(testing::throws_with("does not carry the run's MAC", [&] { run::take_task(view, "s3cret"); }));
  run::set_signed(view, "result", "{\"verdict\": \"pass\"}", "s3cret");
  EXPECT_TRUE(run::get_signed(view, "result", "s3cret").has_value());
  view.set("result", "{\"verdict\": \"forged\"}");
  std::string problem;
  EXPECT_FALSE(run::get_signed(view, "result", "s3cret", &problem).has_value());
  EXPECT_TRUE(testing::contains(problem, "does not carry the run's MAC"));
}

TEST_F(Reliability, RanksStartedWithSrunsVariablesJoin) {
  const std::string seed = DMPCHECK_SOURCE_DIR "/scenarios/regressions/torchrec-1739-dp-tables-not-broadcast.yaml";
  const auto statuses =
      run_ranks("rank", 2, {DMPCHECK_CLI_PATH, "worker", seed, "--out", path("reports")},
                [](int rank, int port) -> std::vector<std::string> {
                  const std::string r = std::to_string(rank);
                  return {"SLURM_PROCID=" + r,       "SLURM_NTASKS=2",        "SLURM_LOCALID=" + r,
                          "SLURM_NTASKS_PER_NODE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)};
                });
  EXPECT_EQ(statuses, (std::vector<int>{0, 0})) << testing::read_file(path("rank0.log"));
  EXPECT_TRUE(testing::contains(testing::read_file(dir_ + "/rank0.log"), "PASS (bug reproduced as expected)"));
}

TEST_F(Reliability, RepeatComparesDigestsAndTimeoutOverridesTheScenario) {
  std::string text = kHang;
  text = testing::replace_once(text, "faults:\n  - {kind: hang, rank: 1, step: 1}\n", "");
  const std::string file = write("plain.yaml", text);
  const size_t repeat =
      start("repeat", {DMPCHECK_CLI_PATH, "run", "--quiet", "--repeat", "3", file, "--out", dir_ + "/r"}, {});
  EXPECT_EQ(wait(repeat), 0) << testing::read_file(dir_ + "/repeat.log");
  EXPECT_TRUE(testing::contains(testing::read_file(dir_ + "/repeat.log"), "every digest identical over 3 repetitions"));
  // A hang with the scenario's 60 s deadline, cut to 2 s from the command line (the message
  // says which deadline the collective had).
  const size_t hang = start(
      "hang", {DMPCHECK_CLI_PATH, "run", "--quiet", "--timeout", "2", write("hang.yaml", kHang), "--out", dir_ + "/h"},
      {});
  EXPECT_EQ(wait(hang), 3);
  EXPECT_TRUE(testing::contains(testing::read_file(dir_ + "/hang.log"), "failed after up to 2000 ms"));
}

}  // namespace
}  // namespace dmpcheck
