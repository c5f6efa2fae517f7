// A key-value store shared by the launcher and its ranks (a c10d TCPStore underneath).  The
// launcher hosts the server; ranks connect as clients.  Values are byte strings.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace dmpcheck::comm {

class StoreImpl;

class Store {
 public:
  ~Store();
  Store(Store&&) noexcept;
  Store& operator=(Store&&) noexcept;

  // Hosts a server on `host`, port 0: the operating system picks a free port, so two launchers
  // on one machine never race for one.  port() says which.
  static Store host(const std::string& host, std::chrono::milliseconds timeout);
  // A store kept in a file inside `directory`, which the caller made private (mkdtemp: 0700):
  // no socket at all, and no other user can reach it.  What dmpcheck's own launcher uses for a
  // single-host run.  path() says where; ranks open_file() it.
  static Store host_file(const std::string& directory, std::chrono::milliseconds timeout);
  static Store open_file(const std::string& path, std::chrono::milliseconds timeout);
  // Connects to a server started elsewhere (rank 0 under an external launcher).
  static Store connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout);
  // Under an external launcher: rank 0 hosts on MASTER_PORT, the other ranks connect.
  static Store for_rank(const std::string& host, uint16_t port, int rank, int world_size,
                        std::chrono::milliseconds timeout);

  uint16_t port() const;               // 0 for a file store
  const std::string& path() const;     // empty for a TCP store
  void set(const std::string& key, const std::string& value);
  // Blocks until `key` exists or the store's timeout passes (Error kTimeout).
  std::string get(const std::string& key);
  // Returns the value if the key exists now, without waiting.
  std::optional<std::string> try_get(const std::string& key);
  int64_t add(const std::string& key, int64_t amount);
  // A view of this store in which every key is prefixed by `prefix` + "/".
  Store with_prefix(const std::string& prefix) const;

  StoreImpl& impl() { return *impl_; }

 private:
  explicit Store(std::unique_ptr<StoreImpl> impl);
  std::unique_ptr<StoreImpl> impl_;
};

}  // namespace dmpcheck::comm
