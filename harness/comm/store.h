// A key-value store shared by a run's processes.  Values are byte strings.  Two kinds: a file in a
// private directory (dmpcheck's own launcher, one host), or dmpcheck's authenticated TCP store
// (auth_store.h: bound to one address, every connection proves the run's secret first), hosted by
// rank 0 under external launchers.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace dmpcheck::comm {

class StoreImpl;
struct RankEnvironment;

class Store {
 public:
  ~Store();
  Store(Store&&) noexcept;
  Store& operator=(Store&&) noexcept;

  // Hosts an authenticated server bound to `address` only (port 0: the operating system picks a
  // free one; port() says which) and connects to it.  Refused connections are reported on stderr.
  static Store host(const std::string& address, const std::string& secret, std::chrono::milliseconds timeout,
                    uint16_t port = 0);
  // A store kept in a file inside `directory`, which the caller made private (mkdtemp: 0700):
  // no socket at all, and no other user can reach it.  What dmpcheck's own launcher uses for a
  // single-host run.  path() says where; ranks open_file() it.
  static Store host_file(const std::string& directory, std::chrono::milliseconds timeout);
  static Store open_file(const std::string& path, std::chrono::milliseconds timeout);
  // Connects to a server started elsewhere and proves `secret` (Error(kCommunication) when refused).
  static Store connect(const std::string& host, uint16_t port, const std::string& secret,
                       std::chrono::milliseconds timeout);
  // Under an external launcher: rank 0 hosts on env.store_port at store_address(env) (loopback
  // for a world on one host, MASTER_ADDR for one that spans hosts); the other ranks connect there.
  static Store for_rank(const RankEnvironment& env, const std::string& secret, std::chrono::milliseconds timeout);

  uint16_t port() const;            // 0 for a file store
  const std::string& path() const;  // empty for a TCP store
  void set(const std::string& key, const std::string& value);
  // Blocks until `key` exists or the store's timeout passes (Error kTimeout).
  std::string get(const std::string& key);
  // Returns the value if the key exists now, without waiting.
  std::optional<std::string> try_get(const std::string& key);
  // A view of this store in which every key is prefixed by `prefix` + "/".
  Store with_prefix(const std::string& prefix) const;

  StoreImpl& impl() { return *impl_; }

 private:
  explicit Store(std::unique_ptr<StoreImpl> impl);
  std::unique_ptr<StoreImpl> impl_;
};

}  // namespace dmpcheck::comm
