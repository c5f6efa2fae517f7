// Where a rank learns who it is: the standard variables torchrun and dmpcheck's own launcher
// set (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace dmpcheck::comm {

struct RankEnvironment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 0;
  std::string launcher;  // whose variables were read: torchrun, slurm, openmpi, pmi
  // torchrun's agent already hosts a TCPStore on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True).
  // A Debian libtorch 1.13 client cannot speak to torch 2.x's store, so rank 0 hosts dmpcheck's
  // own store on store_port instead: $DMPCHECK_STORE_PORT, else MASTER_PORT + 1.
  bool agent_store = false;
  uint16_t store_port = 0;  // where rank 0 hosts (or the launcher hosts) dmpcheck's store
  // DMPCHECK_STORE_FILE: dmpcheck's own launcher hands its ranks a private file store instead of
  // a TCP address (then MASTER_ADDR/MASTER_PORT are not needed).
  std::string store_file;
  // GLOO_SOCKET_IFNAME, as PyTorch reads it: the interface Gloo listens on.
  std::string gloo_interface;
};

// The address this rank's Gloo pairs listen on, chosen as PyTorch does: GLOO_SOCKET_IFNAME wins
// (empty result: use the interface); a world on one host listens on loopback; a world that spans
// hosts listens on the local address that routes to MASTER_ADDR, never a loopback address.
// Error(kInvalidInput) when MASTER_ADDR does not resolve or no route leads there.
std::string gloo_listen_address(const RankEnvironment& env);

// Where dmpcheck's store listens under an external launcher, and where ranks reach it: 127.0.0.1
// when the world is on one host (no other host can connect at all), MASTER_ADDR when it spans
// hosts (rank 0 binds that address only, not every interface).
std::string store_address(const RankEnvironment& env);

// Reads the variables through `lookup` (std::getenv in production, a map in tests), in order:
// torchrun's RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE; Slurm's SLURM_PROCID/SLURM_NTASKS/
// SLURM_LOCALID/SLURM_NTASKS_PER_NODE; Open MPI's OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/
// LOCAL_SIZE; MPICH/Hydra's PMI_RANK/PMI_SIZE/MPI_LOCALRANKID/MPI_LOCALNRANKS.  MASTER_ADDR and
// MASTER_PORT come from the user under every launcher but torchrun.  Missing or malformed
// variables raise Error(kInvalidInput) naming the variable and its value.
RankEnvironment rank_environment_from(const std::function<std::optional<std::string>(const std::string&)>& lookup);
RankEnvironment rank_environment_from_process();

}  // namespace dmpcheck::comm
