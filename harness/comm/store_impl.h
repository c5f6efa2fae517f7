// Private to comm/: the c10d objects behind Store.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace dmpcheck::comm {

class StoreImpl {
 public:
  c10::intrusive_ptr<c10d::Store> store;  // a TCPStore or FileStore, or a PrefixStore over one
  uint16_t port = 0;
  std::string path;  // a FileStore's file
};

}  // namespace dmpcheck::comm
