#include "comm/rendezvous.h"

#include <cstdlib>
#include <cstring>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/error.h"

namespace dmpcheck::comm {
namespace {

int64_t parse_int(const std::string& name, const std::string& text, int64_t min, int64_t max) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) { used = 0; }
  DMP_CHECK(used == text.size() && !text.empty() && value >= min && value <= max, ErrorKind::kInvalidInput,
            "environment variable {}='{}': expected an integer in [{}, {}]", name, text, min, max);
  return value;
}

}  // namespace

RankEnvironment rank_environment_from(const std::function<std::optional<std::string>(const std::string&)>& lookup) {
  struct Names {
    const char* launcher;
    const char* rank;
    const char* size;
    const char* local_rank;
    const char* local_size;
  };
  static const Names kLaunchers[] = {
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
  };
  const Names* names = nullptr;
  for (const auto& candidate : kLaunchers) {
    if (lookup(candidate.rank).has_value()) {
      names = &candidate;
      break;
    }
  }
  DMP_CHECK(
      names != nullptr, ErrorKind::kInvalidInput,
      "no rank variables are set: a rank needs RANK and WORLD_SIZE (torchrun, `dmpcheck run`), SLURM_PROCID and "
      "SLURM_NTASKS (srun), OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE (Open MPI) or PMI_RANK and PMI_SIZE, plus "
      "MASTER_ADDR and MASTER_PORT");
  auto required = [&](const std::string& name) {
    auto value = lookup(name);
    DMP_CHECK(value.has_value(), ErrorKind::kInvalidInput,
              "environment variable {} is not set; under {} a rank needs {}, {}, MASTER_ADDR and MASTER_PORT{}", name,
              names->launcher, names->rank, names->size,
              std::string(names->launcher) == "torchrun"
                  ? ""
                  : " (set MASTER_ADDR and MASTER_PORT yourself, e.g. the first host and a free port)");
    return *value;
  };
  RankEnvironment env;
  env.launcher = names->launcher;
  env.world_size = static_cast<int>(parse_int(names->size, required(names->size), 1, 1 << 20));
  env.rank = static_cast<int>(parse_int(names->rank, required(names->rank), 0, env.world_size - 1));
  if (auto file = lookup("DMPCHECK_STORE_FILE")) env.store_file = *file;
  if (env.store_file.empty() || lookup("MASTER_ADDR")) env.master_addr = required("MASTER_ADDR");
  if (env.store_file.empty() || lookup("MASTER_PORT")) {
    env.master_port = static_cast<uint16_t>(parse_int("MASTER_PORT", required("MASTER_PORT"), 1, 65535));
  }
  env.local_rank = env.rank;
  env.local_world_size = env.world_size;
  if (auto v = lookup(names->local_size)) {
    // SLURM_NTASKS_PER_NODE may read "2(x3)": the leading count is the tasks per node.
    const std::string text = v->substr(0, v->find('('));
    env.local_world_size = static_cast<int>(parse_int(names->local_size, text, 1, env.world_size));
  }
  if (auto v = lookup(names->local_rank)) {
    env.local_rank = static_cast<int>(parse_int(names->local_rank, *v, 0, env.local_world_size - 1));
  }
  const auto agent = lookup("TORCHELASTIC_USE_AGENT_STORE");
  env.agent_store = agent.has_value() && (*agent == "True" || *agent == "true" || *agent == "1");
  env.store_port = env.master_port;
  if (auto v = lookup("DMPCHECK_STORE_PORT")) {
    env.store_port = static_cast<uint16_t>(parse_int("DMPCHECK_STORE_PORT", *v, 1, 65535));
  } else if (env.agent_store) {
    DMP_CHECK(env.master_port < 65535, ErrorKind::kInvalidInput,
              "MASTER_PORT=65535 under torchrun's agent store leaves no MASTER_PORT + 1 for dmpcheck's store; set "
              "DMPCHECK_STORE_PORT");
    env.store_port = static_cast<uint16_t>(env.master_port + 1);
  }
  if (auto v = lookup("GLOO_SOCKET_IFNAME")) env.gloo_interface = *v;
  return env;
}

std::string store_address(const RankEnvironment& env) {
  return env.local_world_size >= env.world_size ? "127.0.0.1" : env.master_addr;
}

std::string gloo_listen_address(const RankEnvironment& env) {
  if (!env.gloo_interface.empty()) return {};
  if (env.local_world_size >= env.world_size) return "127.0.0.1";  // one host
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(env.master_addr.c_str(), nullptr, &hints, &found);
  DMP_CHECK(rc == 0 && found != nullptr, ErrorKind::kInvalidInput, "MASTER_ADDR '{}' does not resolve: {}",
            env.master_addr, rc == 0 ? "no IPv4 address" : ::gai_strerror(rc));
  sockaddr_in target = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  ::freeaddrinfo(found);
  target.sin_port = htons(env.master_port);
  // A UDP "connect" sends nothing: it asks the kernel which local address routes to the target.
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  DMP_CHECK(fd >= 0, ErrorKind::kCommunication, "socket() failed: {}", std::strerror(errno));
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&target), sizeof(target)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  const int err = errno;
  ::close(fd);
  DMP_CHECK(ok, ErrorKind::kInvalidInput, "no route from this host to MASTER_ADDR {}: {} (set GLOO_SOCKET_IFNAME)",
            env.master_addr, std::strerror(err));
  char text[INET_ADDRSTRLEN] = {0};
  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
  std::string address = text;
  // MASTER_ADDR on this very host (e.g. 127.0.0.1) routes through loopback; peers elsewhere
  // could never reach that.  Then the host name's address is the one to listen on.
  if (address.rfind("127.", 0) == 0) {
    char host[256] = {0};
    ::gethostname(host, sizeof(host) - 1);
    addrinfo* mine = nullptr;
    if (::getaddrinfo(host, nullptr, &hints, &mine) == 0 && mine != nullptr) {
      char own[INET_ADDRSTRLEN] = {0};
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(mine->ai_addr)->sin_addr, own, sizeof(own));
      ::freeaddrinfo(mine);
      DMP_CHECK(std::string(own).rfind("127.", 0) != 0, ErrorKind::kInvalidInput,
                "the world spans hosts but MASTER_ADDR {} and this host's name {} are loopback addresses here; set "
                "MASTER_ADDR to an address the other hosts reach, or GLOO_SOCKET_IFNAME",
                env.master_addr, host);
      return own;
    }
  }
  return address;
}

RankEnvironment rank_environment_from_process() {
  return rank_environment_from([](const std::string& name) -> std::optional<std::string> {
    if (const char* value = std::getenv(name.c_str())) return std::string(value);
    return std::nullopt;
  });
}

}  // namespace dmpcheck::comm
