// dmpcheck's own TCP store for runs under external launchers (torchrun, srun, mpirun, by hand):
// the server binds one address (loopback for a world on one host, MASTER_ADDR's for a world that
// spans hosts), and a connection gets nothing until it proves the run's secret.
//
// Handshake (every field fixed size, hex):
//   server -> client  "DMPSTOR1" nonce_s(64)
//   client -> server  nonce_c(64) HMAC(secret, "client" nonce_s nonce_c)(64)
//   server -> client  HMAC(secret, "server" nonce_s nonce_c)(64)
// A client that fails is disconnected and reported through the server's on_refused; a server that
// fails (someone else listening on the port) is refused by the client.  Afterwards requests and
// replies are length-prefixed frames: op, then byte strings.
//
// Why not c10d's TCPStore: in libtorch 1.13 it listens on every interface and has no
// authentication (issue: no one joins a run uninvited).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace dmpcheck::comm {

class AuthStoreServer {
 public:
  using RefusedCallback = std::function<void(const std::string& message)>;
  // Binds `address` (numeric IPv4/IPv6 or a name resolving to a local address), port 0 = any free
  // port.  Error(kCommunication) when the address is not this host's or the port is taken.
  AuthStoreServer(const std::string& address, uint16_t port, std::string secret, RefusedCallback on_refused);
  ~AuthStoreServer();
  AuthStoreServer(const AuthStoreServer&) = delete;
  AuthStoreServer& operator=(const AuthStoreServer&) = delete;

  uint16_t port() const;
  // Connections refused so far (each also went to on_refused).
  int refused_count() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

class AuthStoreClient : public c10d::Store {
 public:
  // Connects (retrying while nothing listens, until `timeout`) and proves the secret.
  // Error(kCommunication) naming host:port when the server refuses or cannot prove it itself;
  // Error(kTimeout) when nothing answers in time.
  AuthStoreClient(const std::string& host, uint16_t port, const std::string& secret, std::chrono::milliseconds timeout);
  ~AuthStoreClient() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
#if TORCH_VERSION_MAJOR >= 2
  // libtorch 2.x: another connection to the same store, proving the same secret.
  c10::intrusive_ptr<c10d::Store> clone() override;
#endif

 private:
  std::vector<std::string> call(uint8_t op, const std::vector<std::string>& args,
                                std::chrono::milliseconds wait_for = {});
  int fd_ = -1;
  std::string host_;
  uint16_t port_ = 0;
  std::string secret_;
  std::string where_;
  std::mutex mutex_;
};

}  // namespace dmpcheck::comm
