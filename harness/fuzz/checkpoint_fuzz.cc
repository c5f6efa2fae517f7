// Fuzz target: bytes as a checkpoint file (`init.from`, a resume's unsharded checkpoint, or a
// plain torch.save(model.state_dict())).  Malformed input must raise dmpcheck::Error, never crash
// or allocate beyond what the bytes hold.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/error.h"
#include "dmp/checkpoint.h"
#include "dmp/torch_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool unchecked = (dmpcheck::dmp::check_zip_crc32(false), true);  // reach libtorch's reader
  (void)unchecked;
  const std::vector<char> bytes(reinterpret_cast<const char*>(data), reinterpret_cast<const char*>(data) + size);
  try {
    (void)dmpcheck::dmp::parse_checkpoint(bytes, "checkpoint.pt");
  } catch (const dmpcheck::Error&) {}
  return 0;
}
