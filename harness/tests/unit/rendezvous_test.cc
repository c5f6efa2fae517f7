#include "comm/rendezvous.h"

#include <map>

#include <gtest/gtest.h>

#include "common/error.h"
#include "test_util.h"

namespace dmpcheck::comm {
namespace {

RankEnvironment from(const std::map<std::string, std::string>& vars) {
  return rank_environment_from([&](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

TEST(Rendezvous, ReadsTheTorchrunVariables) {
  const RankEnvironment env = from({{"RANK", "3"},
                                    {"WORLD_SIZE", "4"},
                                    {"LOCAL_RANK", "1"},
                                    {"LOCAL_WORLD_SIZE", "2"},
                                    {"MASTER_ADDR", "node0"},
                                    {"MASTER_PORT", "29500"}});
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "node0");
  EXPECT_EQ(env.master_port, 29500);
}

TEST(Rendezvous, ReadsSlurmAndOpenMpiAndPmiVariables) {
  const RankEnvironment slurm = from({{"SLURM_PROCID", "5"},
                                      {"SLURM_NTASKS", "8"},
                                      {"SLURM_LOCALID", "1"},
                                      {"SLURM_NTASKS_PER_NODE", "4(x2)"},
                                      {"MASTER_ADDR", "n0"},
                                      {"MASTER_PORT", "29500"}});
  EXPECT_EQ(slurm.launcher, "slurm");
  EXPECT_EQ(slurm.rank, 5);
  EXPECT_EQ(slurm.world_size, 8);
  EXPECT_EQ(slurm.local_rank, 1);
  EXPECT_EQ(slurm.local_world_size, 4);
  const RankEnvironment ompi = from({{"OMPI_COMM_WORLD_RANK", "1"},
                                     {"OMPI_COMM_WORLD_SIZE", "2"},
                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                     {"MASTER_ADDR", "n0"},
                                     {"MASTER_PORT", "29500"}});
  EXPECT_EQ(ompi.launcher, "openmpi");
  EXPECT_EQ(ompi.rank, 1);
  EXPECT_EQ(ompi.local_world_size, 2);
  const RankEnvironment pmi = from({{"PMI_RANK", "0"}, {"PMI_SIZE", "3"}, {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "1"}});
  EXPECT_EQ(pmi.launcher, "pmi");
  EXPECT_EQ(pmi.world_size, 3);
}

TEST(Rendezvous, SrunWithoutMasterAddressSaysWhatToSet) {
  EXPECT_TRUE(testing::throws_with("MASTER_ADDR is not set; under slurm", [] {
    from({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}});
  }));
}

TEST(Rendezvous, MissingAndMalformedVariablesAreNamed) {
  EXPECT_TRUE(testing::throws_with("MASTER_PORT is not set", [] {
    from({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "x"}});
  }));
  EXPECT_TRUE(testing::throws_with("RANK='2': expected an integer in [0, 1]", [] {
    from({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "x"}, {"MASTER_PORT", "1"}});
  }));
}

std::map<std::string, std::string> two_hosts(std::map<std::string, std::string> extra = {}) {
  std::map<std::string, std::string> vars = {{"RANK", "1"},
                                             {"WORLD_SIZE", "2"},
                                             {"LOCAL_RANK", "0"},
                                             {"LOCAL_WORLD_SIZE", "1"},
                                             {"MASTER_ADDR", "127.0.0.1"},
                                             {"MASTER_PORT", "29500"}};
  for (const auto& [k, v] : extra) vars[k] = v;
  return vars;
}

std::map<std::string, std::string> with(std::map<std::string, std::string> vars, const std::string& k,
                                        const std::string& v) {
  vars[k] = v;
  return vars;
}

TEST(RendezvousStore, UnderTorchrunsAgentStoreDmpchecksStoreMovesToTheNextPort) {
  EXPECT_EQ(from(two_hosts()).store_port, 29500);
  const RankEnvironment agent = from(two_hosts({{"TORCHELASTIC_USE_AGENT_STORE", "True"}}));
  EXPECT_TRUE(agent.agent_store);
  EXPECT_EQ(agent.store_port, 29501);
  EXPECT_EQ(from(two_hosts({{"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"DMPCHECK_STORE_PORT", "40000"}})).store_port,
            40000);
  EXPECT_FALSE(from(two_hosts({{"TORCHELASTIC_USE_AGENT_STORE", "False"}})).agent_store);
  EXPECT_TRUE(testing::throws_with("set DMPCHECK_STORE_PORT", [] {
    from(two_hosts({{"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"MASTER_PORT", "65535"}}));
  }));
}

TEST(RendezvousGloo, OneHostListensOnLoopbackAndAnInterfaceWins) {
  EXPECT_EQ(gloo_listen_address(from(with(two_hosts(), "LOCAL_WORLD_SIZE", "2"))), "127.0.0.1");
  const RankEnvironment named = from(two_hosts({{"GLOO_SOCKET_IFNAME", "eth7"}}));
  EXPECT_EQ(named.gloo_interface, "eth7");
  EXPECT_EQ(gloo_listen_address(named), "");  // the communicator uses the interface instead
}

TEST(RendezvousGloo, AcrossHostsNeverListensOnLoopback) {
  // MASTER_ADDR on this host routes through loopback: the host name's address is used instead,
  // or, where that is loopback too, the error says what to set.
  try {
    const std::string address = gloo_listen_address(from(two_hosts()));
    EXPECT_NE(address.rfind("127.", 0), 0u) << address;
  } catch (const Error& e) {
    EXPECT_TRUE(
        testing::contains(e.what(), "set MASTER_ADDR to an address the other hosts reach, or GLOO_SOCKET_IFNAME"));
  }
  EXPECT_TRUE(testing::throws_with("MASTER_ADDR 'no-such-host.invalid' does not resolve", [] {
    gloo_listen_address(from(with(two_hosts(), "MASTER_ADDR", "no-such-host.invalid")));
  }));
}

}  // namespace
}  // namespace dmpcheck::comm
