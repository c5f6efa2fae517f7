// Private to comm/: the c10d objects behind Store.
#pragma once

#include <memory>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "comm/auth_store.h"

namespace dmpcheck::comm {

class StoreImpl {
 public:
  c10::intrusive_ptr<c10d::Store> store;    // an AuthStoreClient or FileStore, or a PrefixStore over one
  std::shared_ptr<AuthStoreServer> server;  // when this process hosts the store (kept alive by every view)
  uint16_t port = 0;
  std::string path;  // a FileStore's file
};

}  // namespace dmpcheck::comm
