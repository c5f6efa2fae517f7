// Compiled instead of nccl_communicator.cc when CMake did not find nccl.h and cudart.
#include "comm/nccl/nccl_communicator.h"

#include "common/error.h"

namespace dmpcheck::comm {

std::optional<std::string> nccl_unavailable_reason(int) {
  return std::string("this dmpcheck was built without NCCL (CMake found no nccl.h and cudart; set CUDAToolkit_ROOT or "
                     "NCCL_ROOT and rebuild with -DDMPCHECK_WITH_NCCL=ON)");
}

std::unique_ptr<Communicator> make_nccl_communicator(Store&, int, int, const NcclOptions&) {
  throw_error(ErrorKind::kInvalidInput, *nccl_unavailable_reason(1));
}

}  // namespace dmpcheck::comm
