#include "comm/store.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/store_impl.h"
#include "common/error.h"

namespace dmpcheck::comm {
namespace {

std::unique_ptr<StoreImpl> make_tcp_store(const std::string& host, uint16_t port, bool server,
                                          std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = port;
  options.isServer = server;
  options.waitWorkers = false;
  options.numWorkers = c10::nullopt;
  options.timeout = timeout;
  auto impl = std::make_unique<StoreImpl>();
  try {
    auto tcp = c10::make_intrusive<c10d::TCPStore>(host, options);
    impl->port = tcp->getPort();
    impl->store = tcp;
  } catch (const std::exception& e) {
    throw_error(ErrorKind::kCommunication,
                fmt::format("cannot {} the rendezvous store at {}:{}: {}",
                            server ? "host" : "connect to", host, port, e.what()));
  }
  return impl;
}

std::string to_string(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

}  // namespace

Store::Store(std::unique_ptr<StoreImpl> impl) : impl_(std::move(impl)) {}
Store::~Store() = default;
Store::Store(Store&&) noexcept = default;
Store& Store::operator=(Store&&) noexcept = default;

Store Store::host(const std::string& host, std::chrono::milliseconds timeout) {
  return Store(make_tcp_store(host, 0, /*server=*/true, timeout));
}

Store Store::host_file(const std::string& directory, std::chrono::milliseconds timeout) {
  Store store = open_file(directory + "/store", timeout);
  // c10d's FileStore makes its file on the first write, and check() waits for the file until the
  // timeout: a store nobody writes to (a launch of programs with a rendezvous of their own) would
  // cost every try_get a full timeout.
  store.set("dmpcheck/store", "1");
  return store;
}

Store Store::open_file(const std::string& path, std::chrono::milliseconds timeout) {
  auto impl = std::make_unique<StoreImpl>();
  try {
    // numWorkers -1: the file is never removed by the store; the launcher removes its directory.
    auto file = c10::make_intrusive<c10d::FileStore>(path, -1);
    file->setTimeout(timeout);
    impl->store = file;
    impl->path = path;
  } catch (const std::exception& e) {
    throw_error(ErrorKind::kCommunication, fmt::format("cannot open the rendezvous store {}: {}", path, e.what()));
  }
  return Store(std::move(impl));
}

Store Store::connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout) {
  return Store(make_tcp_store(host, port, /*server=*/false, timeout));
}

Store Store::for_rank(const std::string& host, uint16_t port, int rank, int world_size,
                      std::chrono::milliseconds timeout) {
  return Store(make_tcp_store(host, port, /*server=*/rank == 0, timeout));
}

uint16_t Store::port() const { return impl_->port; }
const std::string& Store::path() const { return impl_->path; }

void Store::set(const std::string& key, const std::string& value) {
  try {
    impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  } catch (const std::exception& e) {
    throw_error(ErrorKind::kCommunication, fmt::format("store set '{}' failed: {}", key, e.what()));
  }
}

std::string Store::get(const std::string& key) {
  try {
    return to_string(impl_->store->get(key));
  } catch (const std::exception& e) {
    const std::string what = e.what();
    const bool timed_out = what.find("imeout") != std::string::npos;
    throw_error(timed_out ? ErrorKind::kTimeout : ErrorKind::kCommunication,
                fmt::format("store get '{}' failed: {}", key, what));
  }
}

std::optional<std::string> Store::try_get(const std::string& key) {
  try {
    if (!impl_->store->check({key})) return std::nullopt;
    return to_string(impl_->store->get(key));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

int64_t Store::add(const std::string& key, int64_t amount) {
  try {
    return impl_->store->add(key, amount);
  } catch (const std::exception& e) {
    throw_error(ErrorKind::kCommunication, fmt::format("store add '{}' failed: {}", key, e.what()));
  }
}

Store Store::with_prefix(const std::string& prefix) const {
  auto impl = std::make_unique<StoreImpl>();
  impl->port = impl_->port;
  impl->path = impl_->path;
  impl->store = c10::make_intrusive<c10d::PrefixStore>(prefix, impl_->store);
  return Store(std::move(impl));
}

}  // namespace dmpcheck::comm
