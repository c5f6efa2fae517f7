// Ranks started by hand with the variables torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT), as an external launcher would: rank 0 hosts the store, both run the seed matrix.
#include <cstdlib>
#include <filesystem>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "multiproc/multiproc_util.h"

namespace dmpcheck {
namespace {

// A port the OS considers free right now.  External launchers choose MASTER_PORT up front, so
// this test has the race they have; it retries once on a collision.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

TEST(ExternalLauncher, RanksStartedFromTorchrunVariablesRunTheSeedMatrix) {
  const std::string dir = testing::temporary_directory();
  const std::string scenario = DMPCHECK_SOURCE_DIR "/scenarios/regressions/torchrec-1739-dp-tables-not-broadcast.yaml";
  int status = -1;
  for (int attempt = 0; attempt < 2 && status != 0; ++attempt) {
    const int port = free_port();
    std::string command;
    for (int rank = 0; rank < 2; ++rank) {
      command += fmt::format(
          "RANK={0} WORLD_SIZE=2 LOCAL_RANK={0} LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT={1} "
          "timeout 120 {2} worker {3} --out {4}/reports > {4}/rank{0}.log 2>&1 & p{0}=$!; ",
          rank, port, DMPCHECK_CLI_PATH, scenario, dir);
    }
    // Wait by pid: `wait %N` fails with "no such job" once a job has already been reaped.
    command += "wait $p0; s0=$?; wait $p1; s1=$?; exit $((s0 + s1))";
    status = std::system(("bash -c '" + command + "'").c_str());
  }
  const std::string log = testing::read_file(dir + "/rank0.log");
  EXPECT_EQ(status, 0) << log << testing::read_file(dir + "/rank1.log");
  size_t verdicts = 0;
  for (size_t at = log.find("VERDICT"); at != std::string::npos; at = log.find("VERDICT", at + 1)) ++verdicts;
  EXPECT_EQ(verdicts, 4u) << log;
  EXPECT_NE(log.find("[init.mode=unseeded profile=torchrec-0.6]: PASS (bug reproduced as expected)"), std::string::npos)
      << log;
  EXPECT_TRUE(std::filesystem::exists(dir + "/reports/torchrec-1739-dp-tables-not-broadcast/unseeded_torchrec-1.9.json"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dmpcheck
