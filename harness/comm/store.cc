#include "comm/store.h"

#include <cstdio>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "comm/auth_store.h"
#include "comm/rendezvous.h"
#include "comm/store_impl.h"
#include "common/error.h"

namespace dmpcheck::comm {
namespace {

std::string to_string(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

}  // namespace

Store::Store(std::unique_ptr<StoreImpl> impl) : impl_(std::move(impl)) {}
Store::~Store() = default;
Store::Store(Store&&) noexcept = default;
Store& Store::operator=(Store&&) noexcept = default;

Store Store::host(const std::string& address, const std::string& secret, std::chrono::milliseconds timeout,
                  uint16_t port) {
  auto server = std::make_shared<AuthStoreServer>(address, port, secret, [](const std::string& message) {
    std::fprintf(stderr, "dmpcheck: %s\n", message.c_str());
  });
  Store store = connect(address, server->port(), secret, timeout);
  store.impl_->server = std::move(server);
  return store;
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

Store Store::connect(const std::string& host, uint16_t port, const std::string& secret,
                     std::chrono::milliseconds timeout) {
  auto impl = std::make_unique<StoreImpl>();
  impl->port = port;
  impl->store = c10::make_intrusive<AuthStoreClient>(host, port, secret, timeout);
  return Store(std::move(impl));
}

Store Store::for_rank(const RankEnvironment& env, const std::string& secret, std::chrono::milliseconds timeout) {
  const std::string address = store_address(env);
  if (env.rank == 0) return host(address, secret, timeout, env.store_port);
  return connect(address, env.store_port, secret, timeout);
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
  } catch (const Error& e) {
    throw_error(e.kind(), fmt::format("store get '{}' failed: {}", key, e.what()));
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
  } catch (const std::exception&) { return std::nullopt; }
}

Store Store::with_prefix(const std::string& prefix) const {
  auto impl = std::make_unique<StoreImpl>(*impl_);  // the same port, path and server
  impl->store = c10::make_intrusive<c10d::PrefixStore>(prefix, impl_->store);
  return Store(std::move(impl));
}

}  // namespace dmpcheck::comm
